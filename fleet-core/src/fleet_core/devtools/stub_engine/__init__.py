"""A fast stand-in for an inference engine (vLLM or llama.cpp's server), for tests, demos and
benchmarks.

It speaks the engines' OpenAI-compatible wire format closely enough for a proxy to be tested
against it (SSE framing, usage reporting, error envelopes, ``/metrics`` names) and can be told to
misbehave: slow starts, slow tokens, broken streams. It counts what it does (``/stats``), so a test
can prove, say, that a client's disconnect cancelled generation upstream.

    async with running_stub(StubSettings(model="m")) as base_url:
        ...  # OpenAI(base_url=f"{base_url}/v1")
"""

from fleet_core.devtools.stub_engine.app import create_app
from fleet_core.devtools.stub_engine.engine import Stats
from fleet_core.devtools.stub_engine.serving import running_app, running_stub
from fleet_core.devtools.stub_engine.settings import DEFAULT_REPLY, Profile, StubSettings

__all__ = [
    "DEFAULT_REPLY",
    "Profile",
    "Stats",
    "StubSettings",
    "create_app",
    "running_app",
    "running_stub",
]
