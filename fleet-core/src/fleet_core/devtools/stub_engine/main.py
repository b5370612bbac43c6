"""``fleet-stub-engine``: run a stub engine as its own process, until SIGTERM or SIGINT.

The API key may come from the environment (``VLLM_API_KEY`` / ``LLAMA_API_KEY``, as the real
engines read it) to keep it off the command line; the environment is read here and only here.
Once listening, one line ``fleet-stub-engine: <profile> <model> on <url>`` goes to stdout, so a
parent started with ``--port 0`` learns the port.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any

import msgspec

from fleet_core.devtools.stub_engine.app import create_app
from fleet_core.devtools.stub_engine.serving import running_app
from fleet_core.devtools.stub_engine.settings import StubSettings

__all__ = ["main", "parser", "settings_from"]

KEY_ENV = {"vllm": "VLLM_API_KEY", "llamacpp": "LLAMA_API_KEY"}
# (flag, type, help); each maps to the StubSettings field of the same name, whose default applies.
_TUNABLES: tuple[tuple[str, Callable[[str], Any], str], ...] = (
    ("--latency-ms", float, "delay before each response starts"),
    ("--token-delay-ms", float, "delay before each generated token"),
    ("--fail-after-tokens", int, "cut streams after N content frames; non-streams answer 500"),
    ("--reply", str, "the canned reply text (one word = one token)"),
    ("--max-num-seqs", int, "requests generating at once; more wait"),
    ("--max-model-len", int, "context length advertised in /v1/models"),
    ("--embedding-dim", int, "length of embedding vectors"),
    ("--kv-capacity-tokens", int, "KV-cache size in tokens (occupancy follows the load)"),
    ("--kv-baseline", float, "KV occupancy 0-1 held regardless of load (scripted pressure)"),
    ("--prefix-cache-chars", int, "model a prefix cache keyed on this many prompt characters"),
    ("--prefix-hit-latency-ms", float, "delay before a response whose prefix is cached"),
    ("--prefix-cache-entries", int, "prefixes the modelled cache holds (LRU)"),
)


def parser() -> argparse.ArgumentParser:
    result = argparse.ArgumentParser(
        prog="fleet-stub-engine",
        description="A fast stand-in for a vLLM or llama.cpp OpenAI-compatible server.",
    )
    arg = result.add_argument
    arg("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    arg("--port", type=int, default=8000, help="port to listen on; 0 picks a free one")
    arg("--model", required=True, help="the one model name served")
    arg("--profile", choices=["vllm", "llamacpp"], default="vllm", help="engine to imitate")
    arg("--api-key", help="require this bearer key on /v1 (default: $VLLM_API_KEY/$LLAMA_API_KEY)")
    defaults = {field.name: field.default for field in msgspec.structs.fields(StubSettings)}
    for flag, kind, text in _TUNABLES:
        default = defaults[_field(flag)]
        arg(flag, type=kind, help=f"{text} (default {default!r})" if kind is not str else text)
    return result


def _field(flag: str) -> str:
    return flag.removeprefix("--").replace("-", "_")


def settings_from(args: argparse.Namespace, environ: Mapping[str, str]) -> StubSettings:
    """The settings named by parsed arguments, the key falling back to the profile's variable."""
    given = {
        _field(flag): getattr(args, _field(flag))
        for flag, _, _ in _TUNABLES
        if getattr(args, _field(flag)) is not None
    }
    return StubSettings(
        model=args.model,
        profile=args.profile,
        api_key=args.api_key or environ.get(KEY_ENV[args.profile]) or None,
        **given,
    )


async def _serve(settings: StubSettings, host: str, port: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with running_app(create_app(settings), host, port, graceful_timeout=3.0) as url:
        print(f"fleet-stub-engine: {settings.profile} {settings.model} on {url}", flush=True)
        await stop.wait()


def _runner() -> Callable[[Coroutine[Any, Any, None]], None]:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency, but optional in spirit
        return asyncio.run
    return uvloop.run


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        settings = settings_from(args, os.environ)
    except ValueError as exc:
        print(f"fleet-stub-engine: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        _runner()(_serve(settings, args.host, args.port))
    except OSError as exc:
        print(
            f"fleet-stub-engine: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
