"""Cost settings from the environment: valid values apply, invalid ones refuse in one line."""

from __future__ import annotations

import pytest

from fleet_core.control_plane.costs.service import CostSettings, cost_settings
from fleet_core.shared.errors import ConfigError


def test_defaults_and_overrides() -> None:
    assert cost_settings({}) == CostSettings()
    found = cost_settings({"FLEET_COST_MIN_COVERAGE": "0.9", "FLEET_COST_MAX_SAMPLE_GAP_S": "120"})
    assert (found.min_coverage, found.max_sample_gap_s) == (0.9, 120)
    assert CostSettings().close_grace_s == 3600
    for text, seconds in (("0", 0), ("90s", 90), ("30m", 1800), ("2h", 7200), ("28d", 2419200)):
        assert cost_settings({"FLEET_COST_CLOSE_GRACE": text}).close_grace_s == seconds


@pytest.mark.parametrize(
    ("env", "name"),
    [
        ({"FLEET_COST_MIN_COVERAGE": "1.5"}, "FLEET_COST_MIN_COVERAGE"),
        ({"FLEET_COST_MIN_COVERAGE": "most"}, "FLEET_COST_MIN_COVERAGE"),
        ({"FLEET_COST_MAX_SAMPLE_GAP_S": "0"}, "FLEET_COST_MAX_SAMPLE_GAP_S"),
        ({"FLEET_COST_MAX_SAMPLE_GAP_S": "-5"}, "FLEET_COST_MAX_SAMPLE_GAP_S"),
        ({"FLEET_COST_CLOSE_GRACE": "1 hour"}, "FLEET_COST_CLOSE_GRACE"),
        ({"FLEET_COST_CLOSE_GRACE": "-1h"}, "FLEET_COST_CLOSE_GRACE"),
        ({"FLEET_COST_CLOSE_GRACE": "29d"}, "FLEET_COST_CLOSE_GRACE"),
    ],
)
def test_invalid_values_refuse_to_start(env: dict[str, str], name: str) -> None:
    with pytest.raises(ConfigError) as info:
        cost_settings(env)
    assert name in str(info.value)
    assert "\n" not in str(info.value)
