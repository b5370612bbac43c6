"""The stand-in's "registry": which local executable runs each image.

A kubelet pulls an image and runs its entrypoint; the stand-in looks the image up in a table and
runs a program of this machine instead. An image missing from the table is what a kubelet could
not pull: the container waits in ``ImagePullBackOff`` and the pod never starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from fleet_serving import profiles, sources

__all__ = ["Image", "fleet_images"]

HOST_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass(frozen=True)
class Image:
    """How to run an image here: its entrypoint (``None``: the container must give a command)
    and the PATH its commands are found on."""

    entrypoint: tuple[str, ...] | None
    path: str = HOST_PATH


def fleet_images(llama_server: Path) -> Mapping[str, Image]:
    """The images the operator renders, mapped to this machine:

    - llama.cpp's ``server`` images (the CPU one; the CUDA one too, since a GPU node here has no
      GPU): their entrypoint is ``/app/llama-server``, so the cached ``llama-server`` built from
      the same project's source (``make llama-server``);
    - the registry fetcher (``curlimages/curl``): the rendered container names its own command
      (``sh -c <script>``), run with this machine's ``sh``, ``curl`` and ``sha256sum``.
    """
    llama = Image(entrypoint=(str(llama_server),))
    return {
        profiles.LLAMACPP.image: llama,
        str(profiles.LLAMACPP.gpu_image): llama,
        sources.FETCH_IMAGE: Image(entrypoint=None),
    }
