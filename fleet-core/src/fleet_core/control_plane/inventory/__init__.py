"""Cluster inventory: the operators' reports (the contract), what they add up to, and endpoints."""
