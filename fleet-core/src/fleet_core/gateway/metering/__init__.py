"""Metering: what each request used, counted twice (engine and gateway, P6), and where it goes."""
