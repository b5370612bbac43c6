"""Writes a real LoRA adapter GGUF for a base GGUF model, with llama.cpp's gguf-py.

    PYTHONPATH=$(e2e/engine/fetch-gguf-py.sh) python e2e/engine/make_lora.py BASE.gguf OUT.gguf

The test of adapters end to end needs an adapter the real engine loads, and nothing may be
downloaded but packages: so one is made here, as ``convert_lora_to_gguf.py`` lays one out
(``general.type = adapter``, ``adapter.type = lora``, ``adapter.lora.alpha``, and per adapted
base tensor ``<name>.lora_a`` of ggml shape [n_in, rank] and ``<name>.lora_b`` of [rank, n_out],
llama-adapter.cpp's checks). Its weights are random with a fixed seed, on every layer's attention
output, large enough that the adapted model's greedy answer differs from the base's: what the
test checks to know the adapter was applied, and only when asked for.

Run with the test venv's Python (for tqdm and PyYAML) and gguf-py plus numpy on PYTHONPATH; kept
out of ``fleet_testing`` so that nothing imported by the tests needs numpy.
"""

from __future__ import annotations

import sys

import gguf
import numpy as np

RANK = 8
TARGET = ".attn_output.weight"
SCALE = 0.1
"""Each factor's standard deviation: the product's entries are about RANK * SCALE² = 0.5, on
weights of a few hundredths — an adapter that changes answers, not one that breaks the model."""


def architecture(reader: gguf.GGUFReader) -> str:
    field = reader.fields["general.architecture"]
    return bytes(field.parts[field.data[0]]).decode()


def main(base_path: str, out_path: str) -> None:
    base = gguf.GGUFReader(base_path)
    writer = gguf.GGUFWriter(out_path, architecture(base))
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(RANK))  # scale alpha / rank = 1
    rng = np.random.default_rng(28)
    targets = [t for t in base.tensors if t.name.endswith(TARGET)]
    if not targets:
        raise SystemExit(f"{base_path}: no tensor named *{TARGET}")
    for tensor in targets:
        n_in, n_out = int(tensor.shape[0]), int(tensor.shape[1])  # ggml order: ne0 is the input
        # numpy shapes are ggml's reversed: lora_a is [n_in, rank] in ggml, (rank, n_in) here.
        a = rng.normal(0.0, SCALE, (RANK, n_in)).astype(np.float32)
        b = rng.normal(0.0, SCALE, (n_out, RANK)).astype(np.float32)
        writer.add_tensor(f"{tensor.name}.lora_a", a)
        writer.add_tensor(f"{tensor.name}.lora_b", b)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    main(*sys.argv[1:3])
