"""The images of the init containers that fetch weights, and what counts as a pinned reference.

By default an ``s3://`` source is copied by ``amazon/aws-cli`` and a ``registry:`` source fetched
by ``curlimages/curl``, from Docker Hub. A cluster without Docker Hub (air-gapped, or a mirror
only) sets operator-wide replacements (``fleet_serving.settings``), and a FleetModel may name its
own (``spec.fetchImage``). Every one must be pinned, by tag or digest, like every image the
operator renders. Pure definitions only.
"""

from __future__ import annotations

import re
from typing import Annotated

import msgspec
from msgspec import Meta

__all__ = ["DEFAULT", "IMAGE_PATTERN", "FetchImages", "PinnedImage", "check_reference"]

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_PATTERN = (
    r"^(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*"
    rf"(?::[0-9]+)?/)?{_COMPONENT}(?:/{_COMPONENT})*"
    r"(?::[a-zA-Z0-9_][a-zA-Z0-9_.-]{0,127}(?:@sha256:[a-f0-9]{64})?|@sha256:[a-f0-9]{64})$"
)
"""An image reference pinned by tag, digest or both (``registry.local:5000/tools/curl:8.11.1``,
``…@sha256:…``): the distribution reference grammar, with the tag or digest required."""

PinnedImage = Annotated[str, Meta(min_length=1, max_length=512, pattern=IMAGE_PATTERN)]


class FetchImages(msgspec.Struct, kw_only=True, frozen=True):
    """The init containers' images, operator-wide."""

    registry: str = "curlimages/curl:8.11.1"
    """Fetches a ``registry:`` source: needs ``sh``, ``curl``, ``sha256sum`` and ``mktemp``."""
    s3: str = "amazon/aws-cli:2.31.0"
    """Copies an ``s3://`` source: its entrypoint must be the AWS CLI (``aws``)."""


DEFAULT = FetchImages()


def check_reference(text: str) -> str:
    """``text`` if it is a pinned image reference, else ValueError saying what one looks like."""
    if len(text) > 512 or re.match(IMAGE_PATTERN, text) is None:
        raise ValueError(
            f"{text!r} is not a pinned image reference like "
            "registry.local:5000/curlimages/curl:8.11.1 (a tag or @sha256: digest is required)"
        )
    return text
