"""Fleet's Kubernetes operator."""

__version__ = "0.1.0"
