"""Console: the gateway serves the web console's shell at ``/`` and at any deep link, and each
script the shell references as JavaScript — never the shell itself under a ``.js`` name (a 200 that
is really index.html blanks the page in a browser while every status check stays green).

Works with a built console and with the placeholder page a checkout without a build serves (it
references no scripts: said so, not failed). An unknown ``/assets/*.js`` must not be the shell
either, which catches a catch-all route even when the shell references nothing.
"""

from __future__ import annotations

import re
import secrets

from fleet_core.cli.smoke.context import Context
from fleet_core.cli.smoke.http import Reply, envelope_ok
from fleet_core.cli.smoke.running import Runner

__all__ = ["AREA", "run", "scripts"]

AREA = "Console"
_SCRIPT = re.compile(r"""(?:src|href)\s*=\s*["']?((?:\.?/)?assets/[^"'\s>?#]+\.m?js)""")
_DEEP_LINK = "/fleet/smoke/deep-link"


def scripts(shell: str) -> list[str]:
    """The ``/assets/*.js`` paths a shell references, in order, once each."""
    found = ["/" + m.removeprefix("./").removeprefix("/") for m in _SCRIPT.findall(shell)]
    return list(dict.fromkeys(found))


def _html(reply: Reply) -> bool:
    return reply.status == 200 and reply.content_type.startswith("text/html")


def _is_shell(reply: Reply, shell: bytes) -> bool:
    head = reply.body.lstrip()[:15].lower()
    return reply.body == shell or head.startswith((b"<!doctype", b"<html"))


async def run(ctx: Context, runner: Runner) -> None:
    root = await ctx.http.call("GET", f"{ctx.gateway}/")
    if root.status == 404 and envelope_ok(root):
        why = "this gateway serves no console yet (404 envelope at /)"
        runner.note(AREA, "GET / (the console)", why)
        return
    seen = f"{root.status} {root.content_type}"
    runner.check(AREA, "GET / serves the console's HTML shell", _html(root), seen)
    deep = await ctx.http.call("GET", f"{ctx.gateway}{_DEEP_LINK}")
    ok = _html(deep) and deep.body == root.body
    what = f"a deep link ({_DEEP_LINK}) serves the same shell"
    runner.check(AREA, what, ok, f"{deep.status} {deep.content_type}")
    await _scripts(ctx, runner, root.body)
    await _unknown_script(ctx, runner, root.body)


async def _scripts(ctx: Context, runner: Runner, shell: bytes) -> None:
    referenced = scripts(shell.decode("utf-8", "replace"))
    if not referenced:
        why = "no assets referenced (placeholder page: no build)"
        runner.note(AREA, "scripts the shell references", why)
    for path in referenced:
        asset = await ctx.http.call("GET", f"{ctx.gateway}{path}")
        ok = (
            asset.status == 200
            and "javascript" in asset.content_type
            and not _is_shell(asset, shell)
        )
        seen = f"{asset.status} {asset.content_type}"
        runner.check(AREA, f"{path} is JavaScript, not the shell", ok, seen)


async def _unknown_script(ctx: Context, runner: Runner, shell: bytes) -> None:
    """Catches a catch-all route even when the shell references no scripts."""
    missing = f"/assets/fleet-smoke-missing-{secrets.token_hex(4)}.js"
    asset = await ctx.http.call("GET", f"{ctx.gateway}{missing}")
    ok = asset.status == 404 and asset.body != shell
    what = "an unknown /assets/*.js is a 404, not the shell"
    runner.check(AREA, what, ok, f"{asset.status} {asset.content_type}")
