"""The stub's HTTP edge: decode the body, make one service call, hand back bytes.

Fixed answers (``/v1/models``, ``/health``, llama-server's ``/props``) are encoded once when the
app is built.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import TypeVar

import msgspec
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry
from starlette.requests import Request
from starlette.responses import Response

from fleet_core.devtools.stub_engine.engine import Engine
from fleet_core.devtools.stub_engine.errors import BadRequest
from fleet_core.devtools.stub_engine.exchange import Exchange
from fleet_core.devtools.stub_engine.service import Job, Service
from fleet_core.devtools.stub_engine.wire import (
    ENCODER,
    ModelCard,
    ModelList,
    decode_chat,
    decode_completion,
    decode_embedding,
)

__all__ = ["Routes"]

T = TypeVar("T")
_JSON = "application/json"
# msgspec names the offending field: "... - at `$.messages[0]`" or "missing required field `x`".
_PARAM = re.compile(r"at `\$\.(\w+)")
_MISSING = re.compile(r"^Object missing required field `(\w+)`$")


class Routes:
    def __init__(self, engine: Engine, registry: CollectorRegistry) -> None:
        self.engine = engine
        self.service = Service(engine)
        self.registry = registry
        settings = engine.settings
        self._models = ENCODER.encode(ModelList(data=[_card(engine)]))
        self._health = b"" if settings.profile == "vllm" else b'{"status":"ok"}'
        # llama-server's /props names its slot count (``--parallel``): the stub's is max_num_seqs
        self._props = ENCODER.encode({"total_slots": settings.max_num_seqs, "is_sleeping": False})

    async def chat(self, request: Request) -> Response:
        return self._exchange(self.service.chat(_decode(decode_chat, await request.body())))

    async def completions(self, request: Request) -> Response:
        body = await request.body()
        return self._exchange(self.service.completion(_decode(decode_completion, body)))

    async def embeddings(self, request: Request) -> Response:
        body = await request.body()
        return self._exchange(self.service.embeddings(_decode(decode_embedding, body)))

    async def models(self, _: Request) -> Response:
        return Response(self._models, media_type=_JSON)

    async def health(self, _: Request) -> Response:
        return Response(self._health, media_type=_JSON if self._health else None)

    async def props(self, _: Request) -> Response:
        return Response(self._props, media_type=_JSON)

    async def tokenize(self, request: Request) -> Response:
        """``POST /tokenize`` as vLLM (``prompt`` → ``count`` and ``tokens``) and llama-server
        (``content`` → ``tokens``) serve it, counting as the stub does: one token a word."""
        body = msgspec.json.decode(await request.body())
        text = body.get("prompt", body.get("content", "")) if isinstance(body, dict) else ""
        if not isinstance(text, str):
            raise BadRequest("'prompt' must be a string")
        tokens = list(range(len(text.split())))
        answer = {"tokens": tokens}
        if self.engine.settings.profile == "vllm":
            answer["count"] = len(tokens)  # type: ignore[assignment]
        return Response(ENCODER.encode(answer), media_type=_JSON)

    async def metrics(self, _: Request) -> Response:
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)

    async def stats(self, _: Request) -> Response:
        return Response(ENCODER.encode(self.engine.stats.snapshot()), media_type=_JSON)

    def _exchange(self, job: Job) -> Exchange:
        return Exchange(
            self.engine, job.work, prompt_tokens=job.prompt_tokens, prompt_head=job.prompt_head
        )


def _card(engine: Engine) -> ModelCard:
    settings = engine.settings
    if settings.profile == "llamacpp":
        return ModelCard(id=settings.model, created=int(time.time()), owned_by="llamacpp")
    return ModelCard(
        id=settings.model,
        created=int(time.time()),
        owned_by="vllm",
        root=settings.model,
        parent=None,
        max_model_len=settings.max_model_len,
    )


def _decode(decode: Callable[[bytes], T], body: bytes) -> T:
    try:
        return decode(body)
    except msgspec.ValidationError as exc:
        match = _PARAM.search(str(exc)) or _MISSING.match(str(exc))
        param = match.group(1) if match else None
        raise BadRequest(str(exc), param=param) from exc
    except msgspec.DecodeError as exc:
        raise BadRequest(f"The request body is not valid JSON: {exc}") from exc
