"""Rewrites a GGUF file with every block-quantized tensor requantized to another block format
(Q8_0 by default), for CPU benchmarks that need, say, a Q8_0 model where llama.cpp's quantizer is
not built. Each tensor is dequantized and quantized again, so it carries the source's rounding as
well as the new format's: use the file for speed, never for accuracy. Float tensors (norms) and
every metadata key are copied; `general.file_type` is set to the new format's.

    python scripts/bench/requantize_gguf.py IN.gguf OUT.gguf [--type Q8_0]

Needs the `gguf` and `numpy` packages (PyPI).
"""
import argparse

import gguf
import numpy as np

# llama.cpp's LLAMA_FTYPE_MOSTLY_* for the formats this script writes.
FILE_TYPE = {"Q8_0": 7, "Q4_0": 2, "Q4_1": 3, "Q5_0": 8}
FLOAT_TYPES = {
    gguf.GGMLQuantizationType.F32,
    gguf.GGMLQuantizationType.F16,
    gguf.GGMLQuantizationType.BF16,
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source")
    parser.add_argument("out")
    parser.add_argument("--type", default="Q8_0", choices=sorted(FILE_TYPE))
    args = parser.parse_args()
    target = gguf.GGMLQuantizationType[args.type]

    reader = gguf.GGUFReader(args.source)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(args.out, arch)
    for field in reader.fields.values():
        # The writer emits the architecture and the GGUF.* header fields itself.
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        value = FILE_TYPE[args.type] if field.name == "general.file_type" else field.contents()
        writer.add_key_value(field.name, value, kind, sub_type=sub)

    changed = 0
    for tensor in reader.tensors:
        if tensor.tensor_type in FLOAT_TYPES:
            writer.add_tensor(tensor.name, np.asarray(tensor.data), raw_dtype=tensor.tensor_type)
            continue
        dense = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        blocks = gguf.quants.quantize(dense.astype(np.float32), target)
        writer.add_tensor(tensor.name, blocks, raw_dtype=target)
        changed += 1

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"{args.out}: {changed} of {len(reader.tensors)} tensors as {args.type}")


if __name__ == "__main__":
    main()
