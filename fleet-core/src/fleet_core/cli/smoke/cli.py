"""``fleet smoke --gateway URL --control-plane URL [--admin-token-file F] [--key-file F]``.

Runs the areas in order, one line per check, then a summary. Exit status: 0 every check passed
(notes are not failures), 1 a check failed (the first one ends the run unless ``--keep-going``),
2 a usage error. Secrets come from files or the environment, never from argv (which every user of
the machine can read): ``--admin-token-file`` (``make dev`` writes ``.dev/admin-token``),
``--key-file`` or FLEET_SMOKE_KEY, ``--metrics-token-file``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from fleet_core.cli.smoke import (
    auth,
    budgets,
    console,
    cors,
    costs,
    engines,
    formats,
    inventory,
    limits,
    metrics,
    openai_compat,
)
from fleet_core.cli.smoke.context import Context, NeedsAdmin, SetupFailed, Throwaway, run_id
from fleet_core.cli.smoke.http import Http
from fleet_core.cli.smoke.limited import Limited, own_gateway
from fleet_core.cli.smoke.running import Runner, Stop

__all__ = ["AREAS", "main"]

Area = Callable[[Context, Runner], Awaitable[None]]
AREAS: dict[str, tuple[str, Area]] = {
    "openai": (openai_compat.AREA, openai_compat.run),
    "console": (console.AREA, console.run),
    "cors": (cors.AREA, cors.run),
    "engines": (engines.AREA, engines.run),
    "formats": (formats.AREA, formats.run),
    "inventory": (inventory.AREA, inventory.run),
    "auth": (auth.AREA, auth.run),
    "limits": (limits.AREA, limits.run),
    "budgets": (budgets.AREA, budgets.run),
    "metrics": (metrics.AREA, metrics.run),
    "costs": (costs.AREA, costs.run),
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fleet smoke", description=__doc__.split("\n")[0])
    parser.add_argument("--gateway", default="http://127.0.0.1:8080", help="the gateway's URL")
    parser.add_argument(
        "--control-plane", default="http://127.0.0.1:8081", help="the control plane's URL"
    )
    parser.add_argument("--admin-token-file", type=Path, help="a control-plane admin credential")
    parser.add_argument("--key-file", type=Path, help="an API key of your own for the OpenAI rows")
    parser.add_argument(
        "--metrics-token-file",
        type=Path,
        help="the gateway's /metrics credential (default: the admin one)",
    )
    parser.add_argument("--model", help="the model to call (default: the first /v1/models lists)")
    parser.add_argument(
        "--hub",
        help="the synthetic hub the control plane pulls from (make smoke passes make dev's); "
        "without it the weight-format rows are skipped",
    )
    parser.add_argument(
        "--own-gateway",
        action="store_true",
        help="auth, rate-limit and metrics rows on a second gateway of its own (make smoke)",
    )
    parser.add_argument("--only", help=f"comma-separated areas: {','.join(AREAS)}")
    parser.add_argument(
        "--keep-going", action="store_true", help="run every check, not stop at the first failure"
    )
    return parser


def _secret(path: Path | None, what: str) -> str | None:
    if path is None:
        return None
    try:
        text = path.read_text().strip()
    except OSError as exc:
        raise SystemExit(_usage(f"cannot read {what} {path}: {exc.strerror}")) from None
    if not text:
        raise SystemExit(_usage(f"{what} {path} is empty"))
    return text


def _usage(message: str) -> int:
    print(f"fleet smoke: {message}", file=sys.stderr)
    return 2


def _areas(only: str | None) -> list[str]:
    chosen = [a.strip() for a in (only or ",".join(AREAS)).split(",") if a.strip()]
    unknown = [a for a in chosen if a not in AREAS]
    if unknown:
        raise SystemExit(_usage(f"unknown area(s) {', '.join(unknown)}; known: {', '.join(AREAS)}"))
    return chosen


async def _own(ctx: Context) -> Limited:
    return await ctx.stack.enter_async_context(own_gateway(ctx.run))


async def _run_area(ctx: Context, runner: Runner, name: str) -> None:
    title, area = AREAS[name]
    try:
        await area(ctx, runner)
    except NeedsAdmin as exc:
        runner.note(title, "skipped", str(exc))
    except SetupFailed as exc:
        runner.check(title, "setup", False, exc)


async def _run(args: argparse.Namespace, runner: Runner) -> None:
    admin = _secret(args.admin_token_file, "--admin-token-file")
    async with Http.open() as session, contextlib.AsyncExitStack() as stack:
        http = Http(session)
        ctx = Context(
            http,
            args.gateway.rstrip("/"),
            args.control_plane.rstrip("/"),
            run_id(),
            admin=admin,
            key=_secret(args.key_file, "--key-file") or os.environ.get("FLEET_SMOKE_KEY") or None,
            model=args.model,
            hub=args.hub.rstrip("/") if args.hub else None,
            metrics_token=_secret(args.metrics_token_file, "--metrics-token-file"),
            make_limited=_own if args.own_gateway else None,
            stack=stack,
        )
        if admin is not None:
            ctx.throwaway = Throwaway(http, ctx.control_plane, admin, ctx.run)
            stack.push_async_callback(_clean, ctx.throwaway, runner)
        print(
            f"fleet smoke {ctx.run}: gateway {ctx.gateway}, control plane {ctx.control_plane}",
            file=runner.out,
        )
        await _areas_until_stopped(ctx, runner, _areas(args.only))


async def _areas_until_stopped(ctx: Context, runner: Runner, names: list[str]) -> None:
    """Every area, until the first failure (``Stop``) or SIGINT/SIGTERM; either way the caller's
    exit stack then deactivates the tenants and stops the second gateway."""
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)
    try:
        for name in names:
            await _run_area(ctx, runner, name)
    except Stop:
        pass
    except asyncio.CancelledError:
        task.uncancel()  # the cleanup's own calls must not be cancelled too
        runner.interrupted = True
        print("interrupted: cleaning up", file=runner.out)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


async def _clean(throwaway: Throwaway, runner: Runner) -> None:
    left = await throwaway.close()
    made = len(throwaway.made)
    if left:
        print(f"cleanup: could not undo {', '.join(left)}", file=runner.out)
    elif made:
        print(
            f"cleanup: deactivated {made} throwaway tenant(s), "
            f"deleted {len(throwaway.rules)} budget rule(s)",
            file=runner.out,
        )


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    _areas(args.only)
    runner = Runner(keep_going=args.keep_going)
    asyncio.run(_run(args, runner))
    print(runner.summary(), file=runner.out)
    raise SystemExit(1 if runner.failed or runner.interrupted else 0)
