"""One way for the session fixtures (`fix_postgres`, `fix_redis`) to hold a real server: found or
started by `servers` for the whole session and stopped at its end, or, when none can be had, the
session fails with the discovery's one-line message saying how to provide one."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager

import pytest

from fleet_testing import servers

__all__ = ["session_server"]

Finder = Callable[[Mapping[str, str]], AbstractContextManager[servers.Server]]


def session_server(find: Finder) -> Iterator[servers.Server]:
    """Yield the server ``find`` gives for this process's environment (``servers.postgres`` or
    ``servers.redis``); meant for ``yield from`` in a session-scoped fixture."""
    with contextlib.ExitStack() as stack:
        try:
            server = stack.enter_context(find(os.environ))
        except servers.HarnessError as exc:
            pytest.fail(str(exc), pytrace=False)  # the one-line message says how to fix it
        yield server
