"""The benches' Go load generator (``bench/loadgen``): its own HTTP/1.1 client, tested.

The generator reads answers itself (status line, Content-Length or chunked bodies, Connection:
close) rather than through net/http, so these tests hold it to what the benches rely on: a
non-200 is an error, not a request; a server that closes every connection is dialled again
without an error; ``first`` times a stream's first frame, not its end. Marked ``e2e`` as the
stub's tests are (``make e2e`` has Go): without ``go`` this fails rather than skips.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import subprocess
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from bench import generator, gobuild, stub
from fleet_testing.ports import free_port

pytestmark = pytest.mark.e2e

MODEL = "bench"
WORDS = 11  # the stub's canned reply, one token a word
KEY = "loadgen-test-engine-key"
DELAY_MS = 20


@contextlib.contextmanager
def _stub(env: dict[str, str]) -> Iterator[str]:
    binary = gobuild.binary(stub.SOURCE)
    assert not isinstance(binary, str), f"no Go stub: {binary}"
    port = free_port()
    process = subprocess.Popen(
        [str(binary), str(port), MODEL],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while not _answers(url + "/health"):
            assert process.poll() is None, "the stub exited"
            assert time.monotonic() < deadline, "the stub did not answer /health"
            time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_non_200_answer_is_an_error_and_the_key_goes_through_the_environment() -> None:
    with _stub({"FLEET_STUB_API_KEY": KEY}) as url:
        refused = generator.run(url, "plain c=2", None, 0.5)
        served = generator.run(url, "stream c=2", KEY, 0.5)
    assert refused["requests"] == 0
    assert refused["errors"] > 0
    assert served["requests"] > 0
    assert served["errors"] == 0


def test_first_times_the_first_frame_and_stream_the_whole_answer() -> None:
    """Paced tokens: the role frame comes at once, the last token ten delays later."""
    with _stub({"FLEET_STUB_TOKEN_DELAY_MS": str(DELAY_MS)}) as url:
        first = generator.run(url, "first c=2", None, 1.0)
        whole = generator.run(url, "stream c=2", None, 1.0)
    assert first["errors"] == whole["errors"] == 0
    assert whole["p50_ms"] >= (WORDS - 1) * DELAY_MS
    assert first["p50_ms"] < DELAY_MS


class _Closing(http.server.BaseHTTPRequestHandler):
    """Answers 200 and closes the connection: HTTP/1.0 (which closes unless told keep-alive),
    with or without a Content-Length, or HTTP/1.1 with ``Connection: close``."""

    length = True

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        if self.length:
            self.send_header("Content-Length", "2")
        if self.protocol_version == "HTTP/1.1":
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.mark.parametrize(
    ("protocol", "length"), [("HTTP/1.0", False), ("HTTP/1.0", True), ("HTTP/1.1", True)]
)
def test_a_server_closing_every_connection_is_dialled_again_without_errors(
    protocol: str, length: bool
) -> None:
    handler = type("Handler", (_Closing,), {"protocol_version": protocol, "length": length})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        figures = generator.run(f"http://127.0.0.1:{server.server_port}", "plain c=2", None, 0.5)
    finally:
        server.shutdown()
        server.server_close()
    assert figures["requests"] > 10
    assert figures["errors"] == 0


def test_a_refused_connection_is_an_error_not_a_crash() -> None:
    figures = generator.run(f"http://127.0.0.1:{free_port()}", "plain c=1", None, 0.3)
    assert figures["requests"] == 0
    assert figures["errors"] > 0
