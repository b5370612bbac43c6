"""A synthetic Hugging Face hub serving generated repositories of real weight formats.

app = create_hub_app()          # serve it: python -m fleet_core.devtools.hub (make dev does)
"""

from fleet_core.devtools.hub.app import Hub, HubRequest, create_hub_app
from fleet_core.devtools.hub.repos import (
    HubFile,
    Repo,
    default_repos,
    generated_repo,
    large_safetensors,
)

__all__ = [
    "Hub",
    "HubFile",
    "HubRequest",
    "Repo",
    "create_hub_app",
    "default_repos",
    "generated_repo",
    "large_safetensors",
]
