"""API keys of projects: issued once, kept only as a digest, revoked but never forgotten."""
