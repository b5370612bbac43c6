"""What an engine's own ``/metrics`` says about its load, read into one struct (pure).

Series per engine kind (names checked against the engines; versions in docs/gateway.md):

- vLLM: ``vllm:kv_cache_usage_perc`` (V1 engine; ``vllm:gpu_cache_usage_perc`` before it),
  ``vllm:num_requests_running``, ``vllm:num_requests_waiting``, and ``vllm:cache_config_info``
  whose labels ``num_gpu_blocks`` × ``block_size`` give the KV capacity in tokens.
- llama.cpp ``llama-server --metrics``: ``llamacpp:requests_processing`` and
  ``llamacpp:requests_deferred``. It publishes no KV occupancy and no capacity; both stay None
  rather than being made up. Its slot count (``--parallel``) is ``total_slots`` in ``/props``.
- vLLM publishes no sequence limit (``--max-num-seqs``): its slot total stays None.
- ``openai`` kind: not scraped.

The text is untrusted: it is read bounded (`MAX_METRICS_BYTES`), values are clamped, and a
scrape that does not parse yields no signals (it is not a failed health check).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import msgspec
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["MAX_METRICS_BYTES", "EngineSignals", "parse_metrics", "parse_props", "scraped"]

MAX_METRICS_BYTES = 1 << 20
_COUNT_LIMIT = 1 << 31


@dataclass(frozen=True, slots=True)
class EngineSignals:
    """One scrape's reading; ``at`` is the gateway's monotonic clock when it was taken."""

    at: float
    running: int | None = None
    waiting: int | None = None
    kv_usage: float | None = None
    kv_capacity_tokens: int | None = None
    slots_total: int | None = None
    """Sequences the engine runs at once, where it says (llama-server's ``/props``)."""

    def fresh(self, now: float, *, max_age: float) -> bool:
        return now - self.at <= max_age


def scraped(engine: str) -> bool:
    """Whether endpoints of this engine kind publish signals worth scraping."""
    return engine in ("vllm", "llamacpp")


def _count(value: float) -> int:
    return int(min(max(value, 0.0), _COUNT_LIMIT)) if math.isfinite(value) else 0


def _ratio(value: float) -> float:
    return min(max(value, 0.0), 1.0) if math.isfinite(value) else 0.0


class _Reading:
    def __init__(self) -> None:
        self.values: dict[str, float] = {}
        self.capacity: int | None = None

    def add(self, name: str, value: float) -> None:
        # Several label sets on one engine: queues add up, an occupancy ratio takes the fullest.
        if name in self.values:
            old = self.values[name]
            value = max(old, value) if name.endswith("_perc") else old + value
        self.values[name] = value

    def get(self, *names: str) -> float | None:
        return next((self.values[n] for n in names if n in self.values), None)


_WANTED = (
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:cache_config_info",
    "llamacpp:requests_processing",
    "llamacpp:requests_deferred",
)


def _read(text: str) -> _Reading:
    # A vLLM exposition is mostly histograms (100+ KB): only the wanted samples are parsed, so a
    # scrape costs the event loop a line scan, not a full parse.
    wanted = "\n".join(line for line in text.splitlines() if line.startswith(_WANTED))
    reading = _Reading()
    for family in text_string_to_metric_families(wanted):
        for sample in family.samples:
            if sample.name == "vllm:cache_config_info":
                reading.capacity = _capacity(sample.labels) or reading.capacity
            else:
                reading.add(sample.name, sample.value)
    return reading


def _capacity(labels: dict[str, str]) -> int | None:
    try:
        blocks, size = int(labels["num_gpu_blocks"]), int(labels["block_size"])
    except (KeyError, ValueError):
        return None
    return blocks * size if 0 < blocks < _COUNT_LIMIT and 0 < size < _COUNT_LIMIT else None


def parse_metrics(engine: str, text: str, *, at: float) -> EngineSignals:
    """The signals in ``text`` for ``engine``; empty signals if it does not parse."""
    try:
        reading = _read(text[:MAX_METRICS_BYTES])
    except (ValueError, TypeError, IndexError):
        return EngineSignals(at)
    if engine == "vllm":
        kv = reading.get("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
        running = reading.get("vllm:num_requests_running")
        waiting = reading.get("vllm:num_requests_waiting")
        capacity = reading.capacity
    else:
        kv, capacity = None, None
        running = reading.get("llamacpp:requests_processing")
        waiting = reading.get("llamacpp:requests_deferred")
    return EngineSignals(
        at,
        running=None if running is None else _count(running),
        waiting=None if waiting is None else _count(waiting),
        kv_usage=None if kv is None else _ratio(kv),
        kv_capacity_tokens=capacity,
    )


class _Props(msgspec.Struct):
    total_slots: int | None = None


_PROPS = msgspec.json.Decoder(_Props)


def parse_props(raw: bytes) -> int | None:
    """llama-server's slot count from its ``/props`` body; None if absent or not believable."""
    try:
        total = _PROPS.decode(raw).total_slots
    except msgspec.DecodeError:  # ValidationError included
        return None
    return total if total is not None and 0 < total < _COUNT_LIMIT else None
