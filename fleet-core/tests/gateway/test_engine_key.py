"""ADR 0010 and 0020: the engine key the gateway sends to discovered engines, derived per cluster
from the fleet engine secret (FLEET_ENGINE_KEY_FILE). The end-to-end proof, through an
operator-rendered engine, is fleet-serving's test_engine_key_e2e.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet_core.gateway.config import GatewayConfig, UpstreamConfig
from fleet_core.gateway.exchange.routing.table import DiscoveredModel, build_table
from fleet_core.gateway.settings import from_env
from fleet_core.shared import engine_keys
from fleet_core.shared.errors import ConfigError

KEY = "k" * 40


def test_discovered_endpoints_get_their_clusters_key_and_static_ones_keep_their_own() -> None:
    static = UpstreamConfig(
        id="a", model="m", endpoints=("http://10.0.0.1:8000",), api_key="own-key"
    )
    discovered = [
        DiscoveredModel("m", "vllm", ("http://10.0.0.1:8000", "http://10.0.0.2:8000"), "c1"),
        DiscoveredModel("m", "vllm", ("http://10.1.0.1:8000",), "c2"),
        DiscoveredModel("m", "vllm", ("http://10.2.0.1:8000",)),  # from an older control plane
    ]
    table = build_table(GatewayConfig(upstreams=(static,)), discovered, engine_key=KEY)
    keys = {t.url: t.api_key for t in table.pools["m"].targets}
    c1, c2 = engine_keys.cluster_key(KEY, "c1"), engine_keys.cluster_key(KEY, "c2")
    assert keys == {
        "http://10.0.0.1:8000": "own-key",
        "http://10.0.0.2:8000": c1,
        "http://10.1.0.1:8000": c2,
        "http://10.2.0.1:8000": "",  # no cluster, no key: the fleet secret itself never leaves
    }
    assert c1 != c2
    assert KEY not in keys.values()
    # Without a key file nothing is sent, as before ADR 0010.
    (target,) = build_table(GatewayConfig(), discovered[:1]).pools["m"].targets[:1]
    assert target.api_key == ""


def test_a_cluster_key_is_hmac_sha256_of_the_cluster_id_as_openssl_computes_it() -> None:
    """`printf %s c1 | openssl dgst -sha256 -hmac secret -r` (the deploy scripts' recipe)."""
    assert engine_keys.cluster_key("secret", "c1") == (
        "4d8f8eb560906bfedd2951eca48d35962c05bb79ee4d6026625da3a3d9f07493"
    )


def test_the_key_file_is_read_once_at_start_and_never_shown(tmp_path: Path) -> None:
    path = tmp_path / "api-key"
    path.write_text(KEY + "\n")
    settings = from_env({"FLEET_ENGINE_KEY_FILE": str(path)}, GatewayConfig())
    path.write_text("rotated-" + KEY)  # a rotation needs a restart (docs/gateway.md)
    assert settings.engine_key == KEY
    assert KEY not in repr(settings)


@pytest.mark.parametrize("content", [None, "", "\n", "short"])
def test_a_named_key_file_that_cannot_work_is_refused(tmp_path: Path, content: str | None) -> None:
    path = tmp_path / "api-key"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match="FLEET_ENGINE_KEY") as refused:
        from_env({"FLEET_ENGINE_KEY_FILE": str(path)}, GatewayConfig())
    assert "\n" not in str(refused.value)
