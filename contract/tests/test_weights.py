"""The weights document: round trip, tolerance of newer writers, and clear errors."""

from __future__ import annotations

import json

import pytest

from fleet_contract import DecodeError, ModelWeights, WeightFile, decode_weights, encode_weights

SHA = "ab" * 32


def test_round_trip_uses_camel_case_names() -> None:
    weights = ModelWeights(
        model_id="tiny",
        status="Ready",
        format="gguf",
        files=(WeightFile(path="model.gguf", size=10, sha256=SHA),),
    )
    wire = json.loads(encode_weights(weights))
    assert wire["modelId"] == "tiny"
    assert wire["files"][0]["sha256"] == SHA
    assert decode_weights(encode_weights(weights)) == weights
    assert weights.ready


def test_a_newer_writer_s_fields_and_states_are_tolerated() -> None:
    newer = {"modelId": "tiny", "status": "Mirroring", "files": [], "region": "eu"}
    weights = decode_weights(json.dumps(newer))
    assert weights.status == "Mirroring"
    assert not weights.ready


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"modelId": "x", "status": "Ready", "files": [{"path": "a", "size": -1, "sha256": SHA}]},
         "$.files[0].size"),
        ({"modelId": "x", "status": "Ready", "files": [{"path": "a", "size": 1, "sha256": "z"}]},
         "$.files[0].sha256"),
        ({"status": "Ready"}, "modelId"),
    ],
)  # fmt: skip
def test_invalid_documents_name_the_field(body: dict[str, object], path: str) -> None:
    with pytest.raises(DecodeError, match=path.replace("$", r"\$").replace("[", r"\[")):
        decode_weights(json.dumps(body))
