"""Admission: who may call (API keys) and how much (two-level limits, reserved then settled, P5)."""
