"""Who may call the control plane: credentials, roles, the per-route guard and the audit trail.

See docs/security.md for the threat model and ADR 0009 for the credential model.
"""
