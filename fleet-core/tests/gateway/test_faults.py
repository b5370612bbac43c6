"""Fault injection: a raw-socket engine misbehaves in every way we know, and the money stays exact.

Each scenario scripts the misbehaving engine (the first pool; a well-behaved engine is its
fallback pool), sends requests through a real gateway on a real Redis, and then asserts the
invariants of `money.Books`: every bucket back to capacity minus what was billed, the in-flight
gauge at 0, one record per admitted request, no 500 anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import httpx
import msgspec
import pytest

from fleet_core.gateway.settings import DatabaseModeSettings
from fleet_testing.fix_fault_engine import (
    END,
    OK_CHAT,
    RESET,
    Script,
    answer,
    chat_frames,
    frame,
    sse,
    usage_frame,
)

from .conftest import TPM, Rig, RigFactory, issue_tenant_key
from .money import envelope

STALL_S = 2.5
GARBAGE = b"HTTP/1.1 banana\r\nbroken\r\n\r\n"
BAD_LENGTH = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: abc\r\n\r\n{}"
CUT_BODY = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n{"ch'
STREAM_OK = (sse(), *chat_frames(["fine", " thanks"]), usage_frame(3, 2), frame("[DONE]"), END)


@dataclass(frozen=True)
class Scenario:
    script: Script
    status: int
    code: str | None = None
    """The error code: in the envelope, or in the SSE error frame of a stream."""
    stream: bool = False
    spare: Script | None = None
    spare_hits: int = 0


SCENARIOS = {
    "reset before the status line": Scenario([RESET], 200, spare_hits=1),
    "closed before the status line": Scenario([], 200, spare_hits=1),
    "garbage status line": Scenario([GARBAGE], 502, "engine_malformed_answer"),
    "Content-Length: abc": Scenario([BAD_LENGTH], 502, "engine_malformed_answer"),
    "body cut short": Scenario([CUT_BODY], 502, "engine_malformed_answer"),
    "stall before the headers": Scenario([STALL_S, OK_CHAT], 504, "engine_timeout"),
    "stall after the headers": Scenario([sse(), STALL_S, END], 200, "engine_timeout", True),
    "stall between frames": Scenario(
        [sse(), *chat_frames(["a", "b"], finish=None), STALL_S, END], 200, "engine_timeout", True
    ),
    "stream cut mid-chunk": Scenario(
        [sse(), *chat_frames(["a"], finish=None), b"ff\r\ndata: {"], 200, "stream_interrupted", True
    ),
    "usage frame late": Scenario(
        [sse(), *chat_frames(["a", "b"]), 0.3, usage_frame(3, 2), frame("[DONE]"), END],
        200,
        stream=True,
    ),
    "429 with Retry-After, then the spare": Scenario(
        [answer(429, {"error": "busy"}, headers={"Retry-After": "7"})], 200, spare_hits=1
    ),
    "503 everywhere, no Retry-After": Scenario(
        [answer(503, b"overloaded")],
        503,
        "engine_overloaded",
        spare=[answer(503, b"overloaded")],
        spare_hits=1,
    ),
    "429 everywhere, with Retry-After": Scenario(
        [answer(429, {"error": {"message": "no slot"}}, headers={"Retry-After": "7"})],
        429,
        "engine_overloaded",
        spare=[answer(429, b"", headers={"Retry-After": "7"})],
        spare_hits=1,
    ),
    "a clean stream": Scenario(list(STREAM_OK), 200, stream=True),
}


@pytest.fixture
async def rig(start_rig: RigFactory) -> Rig:
    return await start_rig()


@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_every_fault_keeps_the_books_exact(rig: Rig, name: str) -> None:
    scenario = SCENARIOS[name]
    rig.engine.then(scenario.script, scenario.script)
    if scenario.spare is not None:
        rig.spare.then(scenario.spare, scenario.spare)
    for _ in range(2):
        response = await rig.send(stream=scenario.stream)
        assert response.status_code == scenario.status, response.text
        assert _code(response, stream=scenario.stream) == scenario.code
    assert rig.engine.hits == 2  # malformed answers and timeouts are never retried elsewhere
    assert rig.spare.hits == 2 * scenario.spare_hits
    found = await rig.books.check(admitted=2)
    if scenario.status >= 400 or scenario.code:
        assert all(r.outcome == "upstream_error" for r in found)
    if scenario.status in (429, 503):
        assert response.headers["retry-after"] == ("7" if scenario.status == 429 else "1")
        assert all(r.prompt_tokens == 0 for r in found)  # nothing generated, nothing billed


async def test_every_fault_in_database_mode_leaves_one_ledger_row_each(
    postgres_url: str, control_plane: httpx.AsyncClient, start_rig: RigFactory, tmp_path: Path
) -> None:
    """The same scenarios, one after another on one gateway in database mode: after each, the
    ledger holds exactly one row per admitted request (and the buckets and gauge balance)."""
    key = await issue_tenant_key(control_plane, tpm=TPM)
    database = DatabaseModeSettings(url=postgres_url, spool_path=tmp_path / "spool.jsonl")
    rig = await start_rig(database=database, key=key, eject_after=100)
    for admitted, (name, scenario) in enumerate(SCENARIOS.items(), start=1):
        rig.engine.then(scenario.script)
        if scenario.spare is not None:
            rig.spare.then(scenario.spare)
        response = await rig.send(stream=scenario.stream)
        assert response.status_code == scenario.status, (name, response.text)
        await rig.books.check(admitted=admitted)


def _code(response: httpx.Response, *, stream: bool) -> str | None:
    if response.status_code >= 400:
        return str(envelope(response)["code"])
    if not stream:
        return None
    for line in response.text.splitlines():
        if line.startswith("data: {") and '"error"' in line:
            return str(msgspec.json.decode(line[6:])["error"]["code"])
    return None


async def test_a_read_timeout_is_504_and_never_ejects(rig: Rig) -> None:
    """Regression: two slow generations ejected a healthy endpoint (eject
    after 2), and each was run again on the spare (double generation)."""
    rig.engine.then([STALL_S, OK_CHAT], [STALL_S, OK_CHAT], [STALL_S, OK_CHAT])
    for _ in range(3):
        response = await rig.send()
        assert response.status_code == 504
        assert "timeout" in envelope(response)["message"]
    assert rig.spare.hits == 0
    async with httpx.AsyncClient() as http:
        health = (await http.get(f"{rig.gw.url}/health")).json()
    [endpoint] = health["upstreams"]["m"]["endpoints"]
    assert endpoint["state"] == "ready", endpoint
    assert (await rig.send()).status_code == 200  # served by the same endpoint, still in rotation
    await rig.books.check(admitted=4)
