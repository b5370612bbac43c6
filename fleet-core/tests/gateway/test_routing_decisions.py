"""The routing decisions as pure functions: scoring, bounded-load affinity, fair queueing and
reading engine signals, on tables of states and with hypothesis for the invariants (ADR 0013)."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet_core.gateway.exchange.routing import affinity
from fleet_core.gateway.exchange.routing.fairness import FairQueue
from fleet_core.gateway.exchange.routing.selection import Candidate, Scoring, choose, score
from fleet_core.gateway.exchange.routing.signals import EngineSignals, parse_metrics, parse_props

SCORING = Scoring(kv_threshold=0.8, kv_penalty=8.0)


@pytest.mark.parametrize(
    ("candidate", "expected"),
    [
        (Candidate(True, 3), 3.0),  # no signals: in flight only (least outstanding)
        (Candidate(True, 3, waiting=4), 7.0),  # the engine's queue counts
        (Candidate(True, 0, kv_usage=0.8), 0.0),  # at the threshold: no penalty
        (Candidate(True, 0, kv_usage=0.9), 4.0),  # half-way to full: half the penalty
        (Candidate(True, 1, waiting=1, kv_usage=1.0), 10.0),  # full: the whole penalty
        (Candidate(True, 0, kv_usage=1.7), 8.0),  # nonsense above 1 is clamped
    ],
)
def test_score_table(candidate: Candidate, expected: float) -> None:
    assert score(candidate, SCORING) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("candidates", "expected"),
    [
        # a KV-full engine loses to one with two more requests in flight
        ([Candidate(True, 0, kv_usage=0.97), Candidate(True, 2, kv_usage=0.3)], 1),
        # an engine with a long internal queue loses although the gateway sends it less
        ([Candidate(True, 1, waiting=9), Candidate(True, 3, waiting=0)], 1),
        # stale signals (None) fall back to least outstanding
        ([Candidate(True, 2), Candidate(True, 1)], 1),
        # a full or down endpoint is never chosen, whatever its score
        ([Candidate(True, 0, slots=0), Candidate(False, 0), Candidate(True, 5, waiting=5)], 2),
        ([Candidate(False, 0), Candidate(True, 1, slots=1)], None),
    ],
)
def test_choose_table(candidates: list[Candidate], expected: int | None) -> None:
    assert choose(candidates, random.Random(0), SCORING) == expected


def test_ties_go_to_random_among_the_lowest_scores() -> None:
    rng = random.Random(3)
    cands = [Candidate(True, 1, waiting=0), Candidate(True, 0, waiting=1), Candidate(True, 3)]
    picks = Counter(choose(cands, rng, SCORING) for _ in range(300))
    assert set(picks) == {0, 1}
    assert min(picks.values()) > 90


URLS = [f"http://e{i}:8000" for i in range(4)]
RING = affinity.build_ring(URLS)


def test_affinity_is_sticky_while_under_the_bound() -> None:
    loads = dict.fromkeys(URLS, 0)
    first = affinity.pick(RING, "p:abc", loads, epsilon=0.25)
    assert first is not None
    for _ in range(20):
        assert affinity.pick(RING, "p:abc", loads, epsilon=0.25) == first


def test_affinity_overflows_to_the_next_endpoint_at_the_bound() -> None:
    loads = dict.fromkeys(URLS, 1)
    home = affinity.pick(RING, "p:hot", loads, epsilon=0.25)
    assert home is not None
    loads[home] = 3  # total 6, n 4: bound ceil(1.25 * 7 / 4) = 3 -> home is at it
    other = affinity.pick(RING, "p:hot", loads, epsilon=0.25)
    assert other not in (None, home)


@pytest.mark.parametrize(
    ("total", "n", "epsilon", "expected"),
    [(0, 4, 0.25, 1), (6, 4, 0.25, 3), (99, 4, 0.25, 32), (10, 1, 0.25, 14)],
)
def test_bound_table(total: int, n: int, epsilon: float, expected: int) -> None:
    assert affinity.bound(total, n, epsilon) == expected


def test_affinity_keys() -> None:
    assert affinity.key_of("s1", "anything", chars=8) == "s:s1"
    same = affinity.key_of(None, "system prompt. user: one", chars=14)
    assert same == affinity.key_of(None, "system prompt. user: two", chars=14)
    assert same != affinity.key_of(None, "other system. user: one", chars=14)
    assert affinity.key_of(None, "", chars=8) is None


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 6),
    keys=st.lists(st.sampled_from(["hot", "hot", "hot", "a", "b", "c", "d", "e"]), max_size=300),
    epsilon=st.sampled_from([0.1, 0.25, 1.0]),
)
def test_bounded_load_invariant(n: int, keys: list[str], epsilon: float) -> None:
    """Placing any sequence of keys (a hot one at half the traffic) never puts an endpoint above
    ceil((1 + ε) × (total + 1) / n) of the load it saw."""
    urls = URLS[:n] + [f"http://x{i}" for i in range(max(0, n - 4))]
    ring = affinity.build_ring(urls)
    loads = dict.fromkeys(urls, 0)
    for key in keys:
        cap = affinity.bound(sum(loads.values()), n, epsilon)
        url = affinity.pick(ring, key, loads, epsilon=epsilon)
        assert url is not None
        loads[url] += 1
        assert loads[url] <= cap


def drain(queue: FairQueue[str]) -> list[str]:
    out = []
    while (entry := queue.pop()) is not None:
        queue.served(entry)
        out.append(entry.item)
    return out


def test_the_issue_case_b_waits_for_at_most_a_few_of_a() -> None:
    queue: FairQueue[str] = FairQueue()
    for i in range(100):
        queue.push("A", f"A{i}", cost=1000)
    for i in range(5):
        queue.push("B", f"B{i}", cost=1000)
    order = drain(queue)
    assert [order.index(f"B{i}") for i in range(5)] == [1, 3, 5, 7, 9]


def test_priority_is_a_weight() -> None:
    queue: FairQueue[str] = FairQueue()
    for i in range(30):
        queue.push("batch", f"b{i}", cost=100)
        queue.push("live", f"l{i}", cost=100, priority=3)
    first = drain(queue)[:20]
    assert sum(item.startswith("l") for item in first) == 15  # 3 : 1


def test_cancelled_entries_leave_and_putback_keeps_the_place() -> None:
    queue: FairQueue[str] = FairQueue()
    a, b, c = (queue.push("t", x, cost=1) for x in "abc")
    queue.cancel(b)
    assert len(queue) == 2
    first = queue.pop()
    assert first is a
    queue.putback([a])
    assert drain(queue) == ["a", "c"]
    queue.cancel(c)  # already served: a no-op
    assert len(queue) == 0


@settings(max_examples=150, deadline=None)
@given(
    backlog=st.integers(1, 200),
    costs=st.lists(st.integers(1, 4000), min_size=1, max_size=10),
    a_cost=st.integers(1, 4000),
)
def test_fairness_bound(backlog: int, costs: list[int], a_cost: int) -> None:
    """However long A's backlog, each of B's requests waits behind at most the A requests whose
    cost fits in the virtual time B's own earlier requests span, plus one."""
    queue: FairQueue[str] = FairQueue()
    for i in range(backlog):
        queue.push("A", f"A{i}", cost=a_cost)
    for i, cost in enumerate(costs):
        queue.push("B", f"B{i}", cost=cost)
    order = drain(queue)
    for i in range(len(costs)):
        before = sum(1 for item in order[: order.index(f"B{i}")] if item.startswith("A"))
        assert before <= sum(costs[:i]) // a_cost + 1


VLLM_TEXT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 5.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.93
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",num_gpu_blocks="2048"} 1.0
"""
OLD_VLLM_TEXT = """\
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.5
vllm:num_requests_waiting{model_name="m"} 1
"""
LLAMA_TEXT = """\
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 7
"""


@pytest.mark.parametrize(
    ("engine", "text", "expected"),
    [
        ("vllm", VLLM_TEXT, EngineSignals(1.0, 3, 5, 0.93, 2048 * 16)),
        ("vllm", OLD_VLLM_TEXT, EngineSignals(1.0, None, 1, 0.5, None)),
        ("llamacpp", LLAMA_TEXT, EngineSignals(1.0, 2, 7, None, None)),  # no occupancy: None
        ("vllm", "this is { not prometheus", EngineSignals(1.0)),
        ("vllm", 'vllm:kv_cache_usage_perc{model_name="m"} NaN\n', EngineSignals(1, kv_usage=0)),
        ("vllm", 'vllm:num_requests_waiting{model_name="m"} -4\n', EngineSignals(1.0, waiting=0)),
        (
            "vllm",
            'vllm:cache_config_info{block_size="x",num_gpu_blocks="9"} 1\n',
            EngineSignals(1.0),
        ),
    ],
)
def test_parse_metrics_table(engine: str, text: str, expected: EngineSignals) -> None:
    assert parse_metrics(engine, text, at=1.0) == expected


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"total_slots": 4, "model_path": "m.gguf"}', 4),
        (b"{}", None),
        (b'{"total_slots": 0}', None),
        (b'{"total_slots": -3}', None),
        (b'{"total_slots": 99999999999}', None),
        (b'{"total_slots": "4"}', None),
        (b'{"total_slots": 4.5}', None),
        (b"[4]", None),
        (b"<html>", None),
        (b"", None),
    ],
)
def test_a_props_body_is_untrusted(body: bytes, expected: int | None) -> None:
    assert parse_props(body) == expected


def test_signals_go_stale_after_two_intervals() -> None:
    signals = EngineSignals(100.0, waiting=3)
    assert signals.fresh(109.9, max_age=10.0)
    assert not signals.fresh(110.1, max_age=10.0)
