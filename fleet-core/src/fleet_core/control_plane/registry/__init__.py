"""The model registry: register models, pull their weights into an object store, verify them."""
