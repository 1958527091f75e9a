#!/usr/bin/env bash
# The vLLM plugin tests: vLLM 0.33.0 in its own venv under .tlaloc/ (kept between runs; reinstalled
# when requirements.txt changes), the vllm-tlaloc plugin built into it (rebuilt when its Rust or
# Python sources change), the SmolLM2 artifact exported with the `tlaloc` binary in $TLALOC
# (default target/debug/tlaloc; the same export as tests/server/run.sh), then the pytest suite on
# each test plugin: `LLM.generate` against the transformers goldens and `vllm serve` with the
# `openai` client.
#
# Environment: TLALOC (binary), TLALOC_TEST_PLUGINS (':'-separated plugin .so paths; default:
# every *.so under .tlaloc/plugins/*/), PYTHON (default python3).
set -euo pipefail
cd "$(dirname "$0")/../.."

TLALOC=${TLALOC:-target/debug/tlaloc}
PYTHON=${PYTHON:-python3}
venv=.tlaloc/vllm-venv
artifact=target/vllm-tests/smol

if [ ! -x "$TLALOC" ]; then
  echo "no tlaloc binary at $TLALOC; build it with \`cargo build -p tlaloc\` or set TLALOC" >&2
  exit 1
fi
# The model and the plugins: sets `gguf` and `plugins`.
source tests/lane_inputs.sh

# vLLM pins the CUDA build of torch (PyPI has no CPU-only one): ~9 GB, installed once.
if [ ! -x "$venv/bin/python" ]; then
  "$PYTHON" -m venv "$venv"
fi
if ! cmp -s tests/vllm/requirements.txt "$venv/requirements.installed"; then
  echo "== install vLLM into $venv"
  # pip holds every wheel (~4 GB) until the install (~9.5 GB) is done; say so before it fails
  # half-way with ENOSPC.
  need_kib=$((15 * 1024 * 1024))
  free_kib=$(df -k --output=avail .tlaloc | tail -1)
  if [ "$free_kib" -lt "$need_kib" ]; then
    echo "installing vLLM into $venv needs 15 GiB free on its disk; $((free_kib / 1024)) MiB are" \
      "free. Free space there, or point .tlaloc at a larger disk." >&2
    exit 1
  fi
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-cache-dir --only-binary=:all: \
    -r tests/vllm/requirements.txt
  cp tests/vllm/requirements.txt "$venv/requirements.installed"
fi

# The plugin is rebuilt when anything it is built from changed. The dev profile shares the
# workspace's `cargo test` build.
sources=$(git ls-files -s crates/tlaloc-py crates/tlaloc-runtime crates/tlaloc-artifact \
  crates/tlaloc-pjrt python/vllm-tlaloc Cargo.lock | sha256sum | cut -d' ' -f1)
sources="$sources $(git diff HEAD -- crates python Cargo.lock | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$venv/vllm-tlaloc.installed" 2>/dev/null)" != "$sources" ]; then
  echo "== build the vllm-tlaloc plugin into $venv"
  PATH="$PWD/$venv/bin:$PATH" MATURIN_PEP517_ARGS="--profile dev" \
    "$venv/bin/pip" install --quiet --disable-pip-version-check --no-build-isolation \
    --force-reinstall --no-deps ./python/vllm-tlaloc
  echo "$sources" > "$venv/vllm-tlaloc.installed"
fi

if [ ! -f "$artifact/tlaloc-serving.json" ] || [ "$TLALOC" -nt "$artifact/tlaloc-serving.json" ]; then
  echo "== export $artifact"
  "$TLALOC" export --checkpoint "$gguf" --max-batch 2 --max-context 128 --prefill-chunk 64 \
    --out "$artifact" --force >/dev/null
fi

export TLALOC_VLLM_ARTIFACT="$PWD/$artifact"
# The engine runs in the test process: faster start, and its errors reach pytest directly.
export VLLM_ENABLE_V1_MULTIPROCESSING=0
# `vllm serve` runs the same worker as `LLM.generate`: it is tested on the first plugin only, to
# keep the lane within CI's budget; `LLM.generate` and the refusals run on every plugin.
status=0
only_first=()
for plugin in "${plugins[@]}"; do
  echo "== vLLM plugin tests on $plugin"
  TLALOC_PJRT_PLUGIN_PATH="$PWD/$plugin" "$venv/bin/python" -m pytest -q -p no:cacheprovider \
    tests/vllm "${only_first[@]}" || status=1
  only_first=(--ignore=tests/vllm/test_serve.py)
done
exit "$status"
