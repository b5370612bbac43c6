"""The control plane on hypercorn, as shipped, against a hostile client on raw sockets.

The same bounds as the gateway's (`shared.http_limits`): each connection's server
(`shared.hypercorn_guard`) counts and times the head, and the guard in front of the app counts
fields and times the body, before any route or credential is looked at.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from fleet_core.control_plane.app import ApiserverSettings, create_apiserver_app, open_resources
from fleet_core.control_plane.main import apiserver_settings
from fleet_core.shared.errors import ConfigError
from fleet_core.shared.http_limits import HttpLimits
from fleet_core.shared.settings import LogSettings
from fleet_testing.asgi import serving
from fleet_testing.raw_http import (
    CLOSED_WITHIN_S,
    answer_of,
    connect,
    envelope,
    send_slowly,
    unfinished_head,
)

LIMITS = HttpLimits(head_timeout_s=1.0, body_timeout_s=1.0, keep_alive_s=30.0)
POST = b"POST /api/v1/credentials HTTP/1.1\r\nHost: x\r\n"


@pytest.fixture
async def url(admin_token: str) -> AsyncIterator[str]:
    settings = ApiserverSettings(log=LogSettings(access=False), admin_token=admin_token)
    async with (
        open_resources(settings) as resources,
        serving(create_apiserver_app(settings, resources), limits=LIMITS) as served,
    ):
        yield served


async def test_a_huge_header_block_is_refused(url: str) -> None:
    reader, writer = await connect(url)
    sending = asyncio.create_task(
        send_slowly(writer, POST + b"X-Big: " + b"a" * (20 << 20) + b"\r\n\r\n", 65536)
    )
    answer = await answer_of(reader)
    sending.cancel()
    writer.close()
    assert envelope(answer, 431)["code"] == "request_headers_too_large"


async def test_too_many_fields_and_a_body_that_never_ends(url: str, admin_token: str) -> None:
    reader, writer = await connect(url)
    fields = b"".join(b"X-F%d: v\r\n" % i for i in range(LIMITS.max_headers + 5))
    writer.write(POST + fields + b"Content-Length: 2\r\n\r\n{}")
    assert envelope(await answer_of(reader), 431)["code"] == "request_headers_too_large"
    writer.close()

    reader, writer = await connect(url)
    auth = b"Authorization: Bearer " + admin_token.encode() + b"\r\n"
    writer.write(POST + auth + b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
    assert envelope(await answer_of(reader), 408)["code"] == "request_timeout"
    writer.close()


async def test_an_unfinished_head_is_a_408_within_the_heads_time(url: str) -> None:
    """Within the head's time, not the keep-alive's (30 s here; 75 s shipped)."""
    bound = LIMITS.head_timeout_s + CLOSED_WITHIN_S
    answer, closed_after = await unfinished_head(url, POST + b"X-Slow: ", within=bound)
    assert envelope(answer, 408)["code"] == "request_timeout"
    assert closed_after < bound


def test_the_bounds_are_read_from_the_environment() -> None:
    env = {"FLEET_HTTP_MAX_HEADERS": "8", "FLEET_HTTP_HEAD_TIMEOUT_S": "2.5"}
    limits = apiserver_settings(env, "127.0.0.1:8081").http_limits
    assert (limits.max_headers, limits.head_timeout_s) == (8, 2.5)
    assert limits.max_head_bytes == HttpLimits().max_head_bytes
    with pytest.raises(ConfigError, match="FLEET_HTTP_KEEP_ALIVE_S=0 would close"):
        apiserver_settings({"FLEET_HTTP_KEEP_ALIVE_S": "0"}, "127.0.0.1:8081")
