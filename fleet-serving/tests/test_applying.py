"""The three-way merge behind ``Kube.ensure``: what counts as drift, and what a patch deletes."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from fleet_serving.applying import (
    APPLIED,
    drifted,
    merge_patch,
    previous,
    quantity,
    with_applied,
)


@pytest.mark.parametrize(
    ("a", "b"),
    [("500m", "0.5"), ("1Gi", "1073741824"), ("2e3", "2k"), ("1.5G", "1500M"), ("8", "8000m")],
)
def test_equal_quantities_written_differently(a: str, b: str) -> None:
    assert quantity(a) == quantity(b)


@pytest.mark.parametrize("text", ["abc", "1Xi", "", "1.2.3", "--1"])
def test_non_quantities(text: str) -> None:
    assert quantity(text) is None


def test_quantity_values() -> None:
    assert quantity("250m") == Decimal("0.25")
    assert quantity("64Gi") == Decimal(64 * 2**30)


def test_quantities_compare_by_value_only_under_resources() -> None:
    desired = {"resources": {"requests": {"cpu": "0.5", "memory": "1Gi"}}, "args": ["0.5"]}
    normalised = {"resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}, "args": ["0.5"]}
    assert not drifted(desired, normalised)
    assert drifted(desired, {**normalised, "args": ["500m"]})  # not a quantity field
    assert drifted(desired, {"resources": {"requests": {"cpu": "1", "memory": "1Gi"}}})


def deployment(**pod: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "m", "namespace": "ns", "labels": {"a": "b"}},
        "spec": {"template": {"spec": {"containers": [{"name": "engine", "image": "x"}], **pod}}},
    }


def test_the_applied_record_round_trips_and_excludes_itself() -> None:
    body = with_applied(deployment(nodeSelector={"pool": "h100"}))
    assert previous(body) == deployment(nodeSelector={"pool": "h100"})
    again = with_applied(body)
    assert again == body
    assert previous({"metadata": {"annotations": {APPLIED: "not json"}}}) is None
    assert previous({"metadata": {}}) is None


def test_a_map_key_dropped_since_the_last_application_is_deleted() -> None:
    last = deployment(nodeSelector={"pool": "h100", "zone": "a"})
    desired = deployment(nodeSelector={"zone": "a"})
    live = with_applied(last)
    assert not drifted(with_applied(desired)["spec"], live["spec"])  # a subset check misses it
    assert drifted(with_applied(desired), live)  # the applied record does not
    patch = merge_patch(last, with_applied(desired))
    assert patch["spec"]["template"]["spec"]["nodeSelector"] == {"pool": None, "zone": "a"}
    # The whole map gone: the map itself is deleted.
    empty = deployment()
    assert merge_patch(last, empty)["spec"]["template"]["spec"]["nodeSelector"] is None
    # Once applied, the same desired object is no drift.
    assert not drifted(with_applied(desired), with_applied(desired))


def test_a_key_dropped_inside_a_list_item_replaces_the_list() -> None:
    last = deployment()
    last["spec"]["template"]["spec"]["containers"][0]["command"] = ["run"]
    desired = deployment()
    assert drifted(with_applied(desired), with_applied(last))
    patch = merge_patch(last, desired)
    assert patch["spec"]["template"]["spec"]["containers"] == [{"name": "engine", "image": "x"}]


def test_without_a_record_the_patch_is_the_desired_object() -> None:
    desired = deployment()
    assert merge_patch(None, desired) == desired
