"""Fleet's gateway and control plane. It never imports Kubernetes (P7)."""

__version__ = "0.1.0"
