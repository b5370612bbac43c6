"""Serve the synthetic hub on its own: ``python -m fleet_core.devtools.hub [--listen HOST:PORT]
[--generated-bytes N]`` (N adds ``fleet/generated``, one safetensors file of N bytes, for
benchmarks). It stops on SIGTERM or SIGINT. ``make dev`` runs it on 127.0.0.1:8090 and points the
control plane's FLEET_HUB_URL at it."""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import Sequence

from fleet_core.devtools.hub.app import Hub, create_hub_app
from fleet_core.devtools.hub.repos import default_repos, generated_repo
from fleet_core.devtools.stub_engine import running_app


async def _serve(host: str, port: int, generated: int) -> None:
    repos = default_repos()
    if generated:
        repos["fleet/generated"] = generated_repo("fleet/generated", generated)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with running_app(create_hub_app(Hub(repos)), host, port) as url:
        print(f"synthetic hub on {url}", flush=True)
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fleet_core.devtools.hub", description=__doc__)
    parser.add_argument("--listen", default="127.0.0.1:8090", help="HOST:PORT (127.0.0.1:8090)")
    parser.add_argument("--generated-bytes", type=int, default=0, help="size of fleet/generated")
    args = parser.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    asyncio.run(_serve(host or "127.0.0.1", int(port), args.generated_bytes))


if __name__ == "__main__":
    main()
