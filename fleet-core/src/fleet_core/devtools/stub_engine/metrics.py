"""``/metrics`` in the dialect of the imitated engine, read live from the engine's counters.

A router scrapes these series to pick engines, so the stub exposes the names the real engine
exposes and nothing it lacks: vLLM's running/waiting gauges, KV-cache usage (under both its old
``gpu_cache_usage_perc`` and new ``kv_cache_usage_perc`` names), ``cache_config_info`` (KV
blocks and block size) and token counters, labelled ``model_name``; llama-server's unlabelled
processing/deferred gauges and token counters, with no occupancy series at all. Each app gets
its own registry; nothing is registered globally.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from fleet_core.devtools.stub_engine.engine import Engine

__all__ = ["BLOCK_SIZE", "registry"]

BLOCK_SIZE = 16
"""Tokens per KV block, vLLM's default on GPUs."""


def registry(engine: Engine) -> CollectorRegistry:
    """A fresh registry holding the collector for ``engine``'s profile."""
    collector = _Vllm(engine) if engine.settings.profile == "vllm" else _LlamaCpp(engine)
    result = CollectorRegistry(auto_describe=False)
    result.register(collector)
    return result


class _Vllm(Collector):
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.labels = [engine.settings.model]

    def collect(self) -> Iterator[Metric]:
        stats, kv = self.engine.stats, self.engine.kv_usage
        yield self._gauge("num_requests_running", "Requests generating.", stats.running)
        yield self._gauge("num_requests_waiting", "Requests waiting for a slot.", stats.waiting)
        yield self._gauge("gpu_cache_usage_perc", "KV-cache usage, 1 = full (old name).", kv)
        yield self._gauge("kv_cache_usage_perc", "KV-cache usage, 1 = full.", kv)
        yield self._counter("prompt_tokens", "Prefill tokens processed.", stats.prompt_tokens)
        yield self._counter("generation_tokens", "Tokens generated.", stats.tokens_generated)
        yield self._cache_config()

    def _cache_config(self) -> Metric:
        """vLLM's ``cache_config_info``: a constant 1 whose labels carry the KV geometry."""
        blocks = self.engine.kv_capacity // BLOCK_SIZE
        family = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig.",
            labels=["block_size", "num_gpu_blocks"],
        )
        family.add_metric([str(BLOCK_SIZE), str(blocks)], 1.0)
        return family

    def _gauge(self, name: str, doc: str, value: float) -> Metric:
        family = GaugeMetricFamily(f"vllm:{name}", doc, labels=["model_name"])
        family.add_metric(self.labels, value)
        return family

    def _counter(self, name: str, doc: str, value: float) -> Metric:
        family = CounterMetricFamily(f"vllm:{name}", doc, labels=["model_name"])
        family.add_metric(self.labels, value)
        return family


class _LlamaCpp(Collector):
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        stats = self.engine.stats
        yield CounterMetricFamily(
            "llamacpp:prompt_tokens", "Number of prompt tokens processed.", stats.prompt_tokens
        )
        yield CounterMetricFamily(
            "llamacpp:tokens_predicted", "Number of generation tokens.", stats.tokens_generated
        )
        yield GaugeMetricFamily(
            "llamacpp:requests_processing", "Number of requests processing.", stats.running
        )
        yield GaugeMetricFamily(
            "llamacpp:requests_deferred", "Number of requests deferred.", stats.waiting
        )
