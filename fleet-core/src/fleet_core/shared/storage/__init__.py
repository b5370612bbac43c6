"""Postgres for the control plane: the connection pool and forward-only schema migrations."""
