"""Tenants and their projects: who may use the fleet, and the limits each is held to."""
