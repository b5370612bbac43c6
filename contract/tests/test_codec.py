"""The v1 wire format: fixtures decode, unknown fields pass, wrong types name their path."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import jsonschema
import pytest

import fleet_contract as fc
from fleet_testing import contract_v1_reader as v1_reader

FIXTURES = Path(__file__).parent / "fixtures"
SNAPSHOT_V1 = Path(__file__).parents[1] / "schemas" / "inventory-v1.0.0.json"


def fixture_bytes(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


@pytest.mark.parametrize("name", ["v1-full.json", "v1-minimal.json", "v1-newer-writer.json"])
def test_committed_v1_fixtures_decode_with_current_code(name: str) -> None:
    report = fc.decode_report(fixture_bytes(name))
    assert report.schema_version == 1
    assert report.observed_at.tzinfo is not None
    assert fc.decode_report(fc.encode_report(report)) == report


def test_full_fixture_keeps_every_detail() -> None:
    report = fc.decode_report(fixture_bytes("v1-full.json"))
    h100, a100, cpu = report.nodes
    assert h100.labels == fc.NodeLabels(zone="eu-west-1a", instance_type="p5.48xlarge")
    assert h100.gpus[0].compute_capability == "9.0"
    assert h100.gpus[0].count == 8
    assert a100.gpus[0].mig_slices == (fc.MigSlice(profile="1g.5gb", count=7),)
    assert cpu.gpus == ()
    assert cpu.ready is False
    phases = [d.phase for d in report.deployments]
    assert phases == ["Pending", "Ready", "Scheduling", "Failed"]
    assert report.deployments[0].endpoints[1] == fc.Endpoint(
        url="http://10.42.0.18:8000", ready=False
    )
    assert report.deployments[3].endpoints == ()


def test_unknown_fields_from_a_newer_writer_are_ignored() -> None:
    report = fc.decode_report(fixture_bytes("v1-newer-writer.json"))
    assert report.nodes[0].gpus[0].product == "L4"
    assert b"driverVersion" not in fc.encode_report(report)


def full_report() -> fc.InventoryReport:
    return fc.InventoryReport(
        schema_version=fc.SCHEMA_VERSION,
        cluster_id="c1",
        observed_at=datetime(2026, 9, 1, 12, 0, tzinfo=UTC),
        reporter_version="test",
        nodes=(
            fc.Node(
                name="n1",
                ready=True,
                schedulable=True,
                labels=fc.NodeLabels(zone="z1", instance_type="g5"),
                gpus=(
                    fc.Gpu(
                        vendor="nvidia",
                        product="A10G",
                        memory_mib=23028,
                        count=4,
                        compute_capability="8.6",
                        mig_slices=(fc.MigSlice(profile="1g.6gb", count=4),),
                    ),
                ),
            ),
        ),
        deployments=(
            fc.ModelDeployment(
                name="m",
                namespace="ns",
                served_model_name="served",
                engine="llamacpp",
                weight_format="gguf",
                gpus_per_replica=1,
                desired_replicas=3,
                ready_replicas=2,
                phase="Pending",
                reason="starting",
                endpoints=(fc.Endpoint(url="http://10.0.0.1:8080", ready=True),),
            ),
        ),
    )


def test_current_encoder_is_read_by_a_v1_reader() -> None:
    encoded = fc.encode_report(full_report())
    old = v1_reader.decoder.decode(encoded)
    assert old.cluster_id == "c1"
    assert old.nodes[0].gpus[0].mig_slices[0].profile == "1g.6gb"
    assert old.nodes[0].labels.instance_type == "g5"
    assert old.deployments[0].endpoints[0].url == "http://10.0.0.1:8080"
    assert old.deployments[0].ready_replicas == 2


def test_current_encoder_validates_against_the_v1_snapshot() -> None:
    schema = json.loads(SNAPSHOT_V1.read_text())
    jsonschema.validate(json.loads(fc.encode_report(full_report())), schema)


def test_wire_is_camel_case() -> None:
    wire = json.loads(fc.encode_report(full_report()))
    assert set(wire) == {
        "schemaVersion",
        "clusterId",
        "observedAt",
        "reporterVersion",
        "nodes",
        "deployments",
        "reportIntervalSeconds",
    }
    assert "memoryMib" in wire["nodes"][0]["gpus"][0]
    assert "servedModelName" in wire["deployments"][0]


def mutate(path: list[str | int], value: object) -> bytes:
    doc = json.loads(fixture_bytes("v1-full.json"))
    target = doc
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    ("path", "value", "where"),
    [
        (["nodes", 0, "gpus", 0, "count"], "eight", "$.nodes[0].gpus[0].count"),
        (["nodes", 1, "ready"], "yes", "$.nodes[1].ready"),
        (["deployments", 2, "engine"], "tgi", "$.deployments[2].engine"),
        (["deployments", 0, "phase"], "Running", "$.deployments[0].phase"),
        (["deployments", 0, "endpoints", 1, "url"], 7, "$.deployments[0].endpoints[1].url"),
        (["nodes", 0, "gpus", 0, "memoryMib"], -1, "$.nodes[0].gpus[0].memoryMib"),
        (["nodes", 0, "gpus", 0, "computeCapability"], "nine", "$.nodes[0].gpus[0]"),
        (["observedAt"], "yesterday", "$.observedAt"),
        (["observedAt"], "2026-09-14T08:30:00", "$.observedAt"),
        (["clusterId"], "", "$.clusterId"),
    ],
)
def test_wrong_values_are_refused_naming_the_field_path(
    path: list[str | int], value: object, where: str
) -> None:
    with pytest.raises(fc.DecodeError, match=r".") as info:
        fc.decode_report(mutate(path, value))
    assert where in str(info.value)


def test_a_missing_required_field_is_named() -> None:
    doc = json.loads(fixture_bytes("v1-full.json"))
    del doc["deployments"][1]["servedModelName"]
    with pytest.raises(fc.DecodeError) as info:
        fc.decode_report(json.dumps(doc))
    assert "servedModelName" in str(info.value)
    assert "$.deployments[1]" in str(info.value)


@pytest.mark.parametrize("version", [2, 0, "1"])
def test_unsupported_schema_version_names_the_supported_ones(version: object) -> None:
    body = mutate(["schemaVersion"], version)
    with pytest.raises(fc.UnsupportedSchemaVersion) as info:
        fc.decode_report(body)
    assert info.value.supported == (1,)
    assert "supports: 1" in str(info.value)


def test_not_json_at_all_is_a_decode_error() -> None:
    with pytest.raises(fc.DecodeError):
        fc.decode_report(b"{not json")
    with pytest.raises(fc.DecodeError):
        fc.decode_report(b"[]")
