"""The operator console, served by the gateway: the built web app (``web/``) and a proxy that
passes the console's ``/api/v1`` calls to the control plane (ADR 0012)."""
