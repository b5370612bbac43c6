"""MIG slices in the inventory: what they are worth in cards, and the shares a report may claim."""

from __future__ import annotations

import json
from fractions import Fraction
from typing import Any

import httpx
import psycopg
import pytest

from fleet_contract import decode_report
from fleet_core.control_plane.inventory import cards

from .conftest import bind
from .test_inventory import report

SEVENTH = {"numerator": 1, "denominator": 7}
QWEN = "http://10.42.0.17:8000"


def with_shares(doc: dict[str, Any], *, share: dict[str, int] | None = SEVENTH) -> dict[str, Any]:
    """The fixture's A100 slices (1g.5gb × 7) with ``share``, and its first deployment on them."""
    doc["nodes"][1]["gpus"][0]["migSlices"][0]["share"] = share
    doc["deployments"][0].update(accelerator="nvidia.com/mig-1g.5gb", gpuShare=share)
    return doc


def test_slices_count_as_their_part_of_a_card_and_unshared_ones_not_at_all() -> None:
    old = report()  # 8 H100 + 1 whole A100 + 7 slices without a share (a reporter before 1.4.0)
    assert cards.capacity(decode_report(_json(old))) == 9
    shared = decode_report(_json(with_shares(report())))
    assert cards.capacity(shared) == 10
    assert cards.slice_cards(shared) == 1
    mixed = report()
    mixed["nodes"][1]["gpus"][0]["migSlices"] = [
        {"profile": "3g.20gb", "count": 1, "share": {"numerator": 3, "denominator": 7}},
        {"profile": "2g.10gb", "count": 1, "share": {"numerator": 2, "denominator": 7}},
        {"profile": "1g.6gb", "count": 3, "share": {"numerator": 1, "denominator": 4}},
    ]
    assert cards.slice_cards(decode_report(_json(mixed))) == Fraction(5, 7) + Fraction(3, 4)


@pytest.mark.parametrize(
    ("change", "param", "code"),
    [
        (
            lambda d: d["nodes"][1]["gpus"][0]["migSlices"][0].update(
                share={"numerator": 8, "denominator": 7}
            ),
            "nodes[1].gpus[0].migSlices[0].share",
            "out_of_range",
        ),
        (
            lambda d: d["nodes"][1]["gpus"][0]["migSlices"][0].update(
                count=2**31 - 1, share={"numerator": 1, "denominator": 1}
            ),
            "nodes[1].gpus[0].migSlices",
            "out_of_range",
        ),
        (
            lambda d: d["deployments"][0].update(accelerator="nvidia.com/gpu"),
            "deployments[0].gpuShare",
            "invalid_share",
        ),
        (
            lambda d: d["deployments"][0].pop("gpuShare"),
            "deployments[0].gpuShare",
            "invalid_share",
        ),
        (
            lambda d: d["deployments"][0].update(gpuShare={"numerator": 2, "denominator": 7}),
            "deployments[0].gpuShare",
            "invalid_share",
        ),
        (
            lambda d: d["deployments"][0].update(gpuShare={"numerator": 9, "denominator": 8}),
            "deployments[0].gpuShare",
            "out_of_range",
        ),
    ],
    ids=["slice-above-a-card", "more-cards-than-a-count", "share-on-a-whole-gpu",
         "mig-without-share", "share-not-what-the-slices-are", "deployment-above-a-card"],
)  # fmt: skip
async def test_shares_a_peer_could_inflate_are_refused_naming_the_field(
    control_plane_url: str, admin_headers: dict[str, str], change: Any, param: str, code: str
) -> None:
    doc = with_shares(report())
    change(doc)
    async with httpx.AsyncClient(headers=admin_headers) as http:
        await bind(http, base=control_plane_url)
        response = await http.put(f"{control_plane_url}/api/v1/inventory", json=doc)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"]) == (param, code)
    assert param in error["message"]


async def test_a_share_equal_to_the_slices_is_accepted_and_placements_split_on_a_new_share(
    start_apiserver: Any, postgres_url: str, admin_headers: dict[str, str]
) -> None:
    control_plane_url = await start_apiserver(database_url=postgres_url)
    first = with_shares(report(observedAt="2026-09-14T08:00:00Z"))
    first["deployments"][0]["gpuShare"] = {"numerator": 2, "denominator": 14}  # 1/7, unreduced
    whole = report(observedAt="2026-09-14T08:01:00Z")  # qwen back on whole GPUs
    async with httpx.AsyncClient(headers=admin_headers) as http:
        await bind(http, base=control_plane_url)
        summaries = []
        for doc in (first, whole):
            put = await http.put(f"{control_plane_url}/api/v1/inventory", json=doc)
            assert put.status_code == 200, put.text
            summaries.append((put.json()["gpus"], put.json()["cards"]))
    assert summaries == [(9, "10"), (9, "9")]  # the second report's slices have no share
    with psycopg.connect(postgres_url) as conn:
        samples = conn.execute(
            "SELECT gpus, slice_num, slice_den FROM capacity_samples ORDER BY observed_at"
        ).fetchall()
        versions = conn.execute(
            "SELECT share_num, share_den, valid_from::text, valid_to::text FROM endpoint_placements"
            " WHERE endpoint = %s ORDER BY valid_from",
            (QWEN,),
        ).fetchall()
    assert samples == [(9, 1, 1), (9, 0, 1)]  # 7 × 1/7 = one card; then no priced slices
    assert [(n, d) for n, d, *_ in versions] == [(1, 7), (1, 1)]
    assert versions[0][3] == versions[1][2]  # split at the second report


def _json(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc).encode()
