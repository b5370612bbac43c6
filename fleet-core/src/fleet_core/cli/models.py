"""``fleet models pull|import|list|show`` against a control plane, with a live progress bar.

    fleet models pull hf://Qwen/Qwen2.5-0.5B-Instruct     # registers it if needed, then pulls
    fleet models pull qwen2.5-0.5b-instruct                # an id already registered
    fleet models import ./gemma-3-270m.gguf --id gemma-3-270m   # no hub: a local file or directory
    fleet models list
    fleet models show qwen2.5-0.5b-instruct

The control plane is ``--api`` or FLEET_CONTROL_PLANE_URL (default http://127.0.0.1:8081); the
credential is FLEET_TOKEN or FLEET_TOKEN_FILE, else the admin token ``make dev`` keeps in
``.dev/admin-token``.
Ctrl-C during a pull or an import cancels it on the control plane (a pull would otherwise go on
without you). Exit status: 0 Ready, 1 it ended otherwise or the API refused, 2 a usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
from rich.console import Console
from rich.progress import Progress, TaskID
from rich.table import Table

from fleet_core.cli import uploading
from fleet_core.cli.client import Api, ApiError
from fleet_core.shared.errors import ConfigError
from fleet_core.shared.tokens import bearer, client_token

__all__ = ["main"]

DEFAULT_API = "http://127.0.0.1:8081"
TERMINAL = ("Ready", "Failed", "Cancelled", "Registered")


async def _models(api: Api) -> AsyncIterator[dict[str, Any]]:
    """Every registered model, following the list's pages (``next``, fleet_core.shared.paging)."""
    path = "/api/v1/models?limit=500"
    while True:
        page = await api.call("GET", path)
        for model in page["data"]:
            yield model
        if not page.get("next"):
            return
        path = f"/api/v1/models?limit=500&after={page['next']}"


async def _resolve(api: Api, target: str, model_format: str | None) -> str:
    """The model id for ``target``: an id, or an hf:// URI registered here when needed."""
    if not target.startswith("hf://"):
        return target
    async for model in _models(api):
        if model["source"].get("uri") == target:
            return str(model["id"])
    body: dict[str, Any] = {"source": {"uri": target}}
    if model_format:
        body["format"] = model_format
    return str((await api.call("POST", "/api/v1/models", body))["id"])


async def _follow(api: Api, model_id: str, console: Console) -> dict[str, Any]:
    last: dict[str, Any] = {}
    columns = uploading.progress_columns()
    with Progress(*columns, console=console, transient=False) as bar:
        task: TaskID = bar.add_task(model_id, total=None, file="")
        async for last in api.events(model_id):
            files = f"{last['filesDone']}/{last['filesTotal']} {last.get('currentFile') or ''}"
            bar.update(
                task, completed=last["bytesDone"], total=last["bytesTotal"] or None, file=files
            )
    return last


async def _pull(api: Api, args: argparse.Namespace, console: Console) -> int:
    interrupted = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, interrupted.set)  # before the pull exists
    try:
        return await _pull_until(api, args, console, interrupted)
    finally:
        loop.remove_signal_handler(signal.SIGINT)


async def _pull_until(
    api: Api, args: argparse.Namespace, console: Console, interrupted: asyncio.Event
) -> int:
    model_id = await _resolve(api, args.target, args.format)
    started = await api.call("POST", f"/api/v1/models/{model_id}/pull")
    if started["status"] == "Ready":
        console.print(f"{model_id} is already Ready")
        return 0
    follow = asyncio.ensure_future(_follow(api, model_id, console))
    waiter = asyncio.ensure_future(interrupted.wait())
    await asyncio.wait((follow, waiter), return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    if interrupted.is_set() and not follow.done():
        follow.cancel()
        final = await api.call("DELETE", f"/api/v1/models/{model_id}/pull")
    else:
        final = await follow
    reason = f": {final['reason']}" if final.get("reason") else ""
    console.print(f"{model_id}: {final['status']}{reason}")
    return 0 if final["status"] == "Ready" else 1


async def _import(api: Api, args: argparse.Namespace, console: Console) -> int:
    interrupted = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, interrupted.set)
    try:
        plan = await uploading.plan(Path(args.path), console)
        model_id = args.id or uploading.default_id(Path(args.path))
        work = asyncio.ensure_future(uploading.run(api, model_id, plan, args, console))
        waiter = asyncio.ensure_future(interrupted.wait())
        await asyncio.wait((work, waiter), return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if interrupted.is_set() and not work.done():
            work.cancel()
            final = await api.call("DELETE", f"/api/v1/models/{model_id}/pull")
        else:
            final = await work
    finally:
        loop.remove_signal_handler(signal.SIGINT)
    reason = f": {final['reason']}" if final.get("reason") else ""
    console.print(f"{model_id}: {final['status']}{reason}")
    return 0 if final["status"] == "Ready" else 1


async def _list(api: Api, console: Console) -> int:
    table = Table("ID", "STATUS", "FORMAT", "SIZE", "SOURCE", "REASON")
    async for model in _models(api):
        facts = model.get("facts") or {}
        source = model["source"]
        where = _where(source)
        size = f"{facts['sizeBytes']:,}" if facts else ""
        fmt = facts.get("format") or model.get("format") or ""
        table.add_row(model["id"], model["status"], fmt, size, where, model["reason"])
    console.print(table)
    return 0


def _where(source: dict[str, Any]) -> str:
    if "local" in source:
        return f"imported: {source['local']['origin']}"
    return str(source.get("uri") or "hf://{repo}@{revision}".format(**source["huggingface"]))


async def _show(api: Api, model_id: str, console: Console) -> int:
    console.print_json(json.dumps(await api.call("GET", f"/api/v1/models/{model_id}")))
    return 0


async def _run(args: argparse.Namespace, token: str | None) -> int:
    console = Console()
    headers = {"Content-Type": "application/json", **bearer(token)}  # every write is JSON
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
        api = Api(session, args.api)
        try:
            if args.action == "pull":
                return await _pull(api, args, console)
            if args.action == "import":
                return await _import(api, args, console)
            if args.action == "list":
                return await _list(api, console)
            return await _show(api, args.target, console)
        except ApiError as exc:
            console.print(f"fleet: {exc}", style="red")
            return 1
        except uploading.LocalFilesError as exc:
            console.print(f"fleet: {exc}", style="red")
            return 2
        except aiohttp.ClientError as exc:
            console.print(f"fleet: cannot reach the control plane at {args.api}: {exc}")
            return 1


def _parser(default_api: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fleet", description="Fleet's command line.")
    parser.add_argument("--api", default=default_api, help=f"control plane ({default_api})")
    nouns = parser.add_subparsers(dest="noun", required=True)
    models = nouns.add_parser("models", help="the model registry")
    actions = models.add_subparsers(dest="action", required=True)
    pull = actions.add_parser("pull", help="pull a model's weights, with progress")
    pull.add_argument("target", help="a model id, or hf://owner/name[@revision] to register")
    pull.add_argument("--format", choices=("safetensors", "gguf"), help="required format")
    imports = actions.add_parser(
        "import", help="register local weights (a file or a directory) without any hub"
    )
    imports.add_argument("path", help="a weights file (.gguf) or a model directory")
    imports.add_argument("--id", help="the model id (default: the file or directory name)")
    imports.add_argument("--format", choices=("safetensors", "gguf"), help="required format")
    actions.add_parser("list", help="list registered models")
    show = actions.add_parser("show", help="one model, with its facts")
    show.add_argument("target", help="a model id")
    nouns.add_parser("smoke", help="prove a running Fleet works end to end (fleet smoke --help)")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["smoke"]:  # its own options and help: fleet_core.cli.smoke.cli
        from fleet_core.cli import smoke

        smoke.main(argv[1:])
    default_api = os.environ.get("FLEET_CONTROL_PLANE_URL") or DEFAULT_API
    args = _parser(default_api).parse_args(argv)
    try:
        token = client_token(os.environ)
    except ConfigError as exc:
        print(f"fleet: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    raise SystemExit(asyncio.run(_run(args, token)))


if __name__ == "__main__":
    main(sys.argv[1:])
