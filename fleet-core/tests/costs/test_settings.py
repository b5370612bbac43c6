"""Cost settings from the environment: valid values apply, invalid ones refuse in one line."""

from __future__ import annotations

import pytest

from fleet_core.costs.service import CostSettings, cost_settings
from fleet_core.errors import ConfigError


def test_defaults_and_overrides() -> None:
    assert cost_settings({}) == CostSettings()
    found = cost_settings({"FLEET_COST_MIN_COVERAGE": "0.9", "FLEET_COST_MAX_SAMPLE_GAP_S": "120"})
    assert (found.min_coverage, found.max_sample_gap_s) == (0.9, 120)


@pytest.mark.parametrize(
    ("env", "name"),
    [
        ({"FLEET_COST_MIN_COVERAGE": "1.5"}, "FLEET_COST_MIN_COVERAGE"),
        ({"FLEET_COST_MIN_COVERAGE": "most"}, "FLEET_COST_MIN_COVERAGE"),
        ({"FLEET_COST_MAX_SAMPLE_GAP_S": "0"}, "FLEET_COST_MAX_SAMPLE_GAP_S"),
        ({"FLEET_COST_MAX_SAMPLE_GAP_S": "-5"}, "FLEET_COST_MAX_SAMPLE_GAP_S"),
    ],
)
def test_invalid_values_refuse_to_start(env: dict[str, str], name: str) -> None:
    with pytest.raises(ConfigError) as info:
        cost_settings(env)
    assert name in str(info.value)
    assert "\n" not in str(info.value)
