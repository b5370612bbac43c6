"""Fleet as it ships, on the test node: ``deploy/`` applied by ``deploy/install.sh`` and driven
through ``deploy/walk.sh`` (:mod:`e2e.tests.test_deploy_walk`), and what a test reads from it.

The operator, control plane, gateway and Redis are pods; a test reaches the control plane and the
gateway at their ClusterIPs (the node routes the host to Services), reads the ledger from the
harness's Postgres, and sends a client's traffic from a thread (:class:`Traffic`), each request
under an ``X-Request-Id`` of its own so every answer can be matched to its ledger row, or to none
(:func:`ledger_matches`).
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
import psycopg.rows

from fleet_testing.fleet_system import Api
from fleet_testing.node import KubeNode
from fleet_testing.waiting import eventually_blocking

__all__ = ["Answer", "Shipped", "Traffic", "ledger_matches"]

MODEL_LABEL = "serving.fleet.dev/model"


@dataclass
class Shipped:
    """The walk's deployment: its FleetModel ``name`` in ``namespace`` serves ``model``."""

    node: KubeNode
    admin: Api
    gateway: str
    database_url: str
    model: str
    name: str
    namespace: str = "fleet-models"

    def kubectl(self, *args: str, check: bool = True) -> str:
        return self.node.kubectl(*args, check=check)

    def fleetmodel(self) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(
            self.kubectl("-n", self.namespace, "get", "fleetmodel", self.name, "-o", "json")
        )
        return found

    def patch(self, patch: dict[str, Any]) -> None:
        """A merge patch of the FleetModel (``None`` values remove fields)."""
        self.kubectl("-n", self.namespace, "patch", "fleetmodel", self.name, "--type=merge",
                     "-p", json.dumps(patch))  # fmt: skip

    def until_status(
        self, wanted: Callable[[dict[str, Any]], bool], *, within: float, what: str
    ) -> dict[str, Any]:
        """The FleetModel's status once ``wanted(status)``; a timeout names the last one seen."""
        seen: dict[str, Any] = {}

        def check() -> dict[str, Any] | None:
            body = self.fleetmodel()
            seen.clear()
            seen.update(body.get("status") or {})
            current = body["metadata"]["generation"] == seen.get("observedGeneration")
            return dict(seen) if current and wanted(seen) else None

        try:
            return eventually_blocking(check, within=within, what=what, interval=1.0)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last status: {seen}") from None

    def until_ready(self, *, within: float = 300) -> dict[str, Any]:
        """Ready on the current spec, every replica running it."""
        return self.until_status(lambda s: s.get("phase") == "Ready", within=within,
                                 what=f"{self.name} Ready")  # fmt: skip

    def engine_pods(self) -> list[dict[str, Any]]:
        pods = json.loads(self.kubectl("-n", self.namespace, "get", "pods", "-l",
                                       f"{MODEL_LABEL}={self.name}", "-o", "json"))  # fmt: skip
        return [p for p in pods["items"] if not p["metadata"].get("deletionTimestamp")]

    def ledger(self, key_id: str) -> list[dict[str, Any]]:
        with psycopg.connect(self.database_url, row_factory=psycopg.rows.dict_row) as conn:
            return conn.execute(
                "SELECT * FROM ledger WHERE key_id = %s ORDER BY received_at", (key_id,)
            ).fetchall()

    def api_key(self, tenant: str) -> tuple[str, str]:
        """A new tenant's key: (its id, its secret)."""
        self.admin.call("POST", "/api/v1/tenants", {"id": tenant, "name": tenant})
        self.admin.call("POST", "/api/v1/projects", {"tenantId": tenant, "name": "default"})
        issued = self.admin.call("POST", "/api/v1/keys",
                                 {"projectId": f"{tenant}/default", "label": "e2e"})  # fmt: skip
        return str(issued["id"]), str(issued["secret"])


@dataclass(frozen=True)
class Answer:
    """One request's end as the client saw it: its own id, the status (None when the client gave
    up or the connection broke), the error code of an envelope, the usage's completion tokens."""

    client_id: str
    status: int | None
    code: str | None = None
    completion_tokens: int | None = None


@dataclass
class Traffic:
    """A client sending one short chat completion after another from a thread while a test
    changes the deployment under it; every answer kept."""

    gateway: str
    key: str
    model: str
    timeout_s: float = 30.0
    answers: list[Answer] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Traffic:
        self._thread = threading.Thread(target=self._run, name="traffic", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(self.timeout_s + 5)

    def until_answered(self, count: int, *, within: float = 120) -> None:
        """Until ``count`` more requests have ended."""
        wanted = len(self.answers) + count
        eventually_blocking(lambda: len(self.answers) >= wanted, within=within,
                            what=f"{count} more answers")  # fmt: skip

    def statuses(self) -> dict[int | None, int]:
        counted: dict[int | None, int] = {}
        for answer in self.answers:
            counted[answer.status] = counted.get(answer.status, 0) + 1
        return counted

    def _run(self) -> None:
        while not self._stop.is_set():
            self.answers.append(self.send())
            self._stop.wait(0.2)

    def send(self) -> Answer:
        client_id = f"e2e-{uuid.uuid4().hex}"
        body = {"model": self.model, "max_tokens": 4,
                "messages": [{"role": "user", "content": "Say hi."}]}  # fmt: skip
        request = urllib.request.Request(
            f"{self.gateway}/v1/chat/completions", data=json.dumps(body).encode(), method="POST"
        )
        request.add_header("Authorization", f"Bearer {self.key}")
        request.add_header("Content-Type", "application/json")
        request.add_header("X-Request-Id", client_id)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:
                said = json.loads(answer.read())
                tokens = said["usage"]["completion_tokens"]
                return Answer(client_id, int(answer.status), completion_tokens=tokens)
        except urllib.error.HTTPError as exc:
            with exc:
                try:
                    code = json.loads(exc.read())["error"]["code"]
                except (ValueError, KeyError, TypeError):
                    code = None
                return Answer(client_id, exc.code, code=code)
        except (OSError, ValueError):
            return Answer(client_id, None)


def ledger_matches(shipped: Shipped, key_id: str, answers: list[Answer]) -> list[dict[str, Any]]:
    """Asserts the ledger holds exactly what the client saw, once the writer caught up: a row
    for every answered 200 with its completion tokens; for an error, no row or one row with the
    same status; for a request the client gave up on, at most one row; no row of another
    request. The ledger's rows of ``key_id``."""
    sent = {a.client_id: a for a in answers}
    served = {a.client_id for a in answers if a.status == 200}

    def caught_up() -> list[dict[str, Any]] | None:
        rows = shipped.ledger(key_id)
        seen = {r["client_request_id"] for r in rows}
        return rows if served <= seen else None

    rows = eventually_blocking(caught_up, within=60, what="a ledger row for every 200")
    ids = [r["client_request_id"] for r in rows]
    assert len(ids) == len(set(ids)), "a request recorded twice"
    for row in rows:
        answer = sent.get(row["client_request_id"])
        assert answer is not None, f"a ledger row no request of this test made: {row}"
        if answer.status == 200:
            assert (row["status"], row["outcome"]) == (200, "ok"), row
            assert row["completion_tokens"] == answer.completion_tokens, (row, answer)
        elif answer.status is not None:
            assert row["status"] == answer.status, (row, answer)
    return rows
