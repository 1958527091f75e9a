#!/usr/bin/env bash
# `vllm serve` running an artifact through the vllm-tlaloc plugin against `tlaloc serve` on the
# same artifact and plugin, with the same load harness (tests/server/loadtest.py: streaming
# /v1/completions, greedy, every request exactly MAX_TOKENS tokens), at concurrency 1 and 16.
# Both servers run release builds; vLLM's scheduler is given the artifact's limits (the largest
# decode batch, the prefill chunk as its token budget) and prefix caching, as tlaloc's own.
# Needs the vLLM venv that tests/vllm/run.sh installs (.tlaloc/vllm-venv) and the CPU plugins.
# Usage: bash scripts/bench_vllm_serve.sh [PLUGIN_SO]   (default: the xla-cpu-pjrt plugin)
# Environment: MAX_TOKENS (64), ROUNDS (3: runs of each point), OUT (.tlaloc/bench/vllm-serve).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.tlaloc/vllm-venv
plugin=$(realpath "${1:-$(ls .tlaloc/plugins/xla-cpu-pjrt-*/*.so | head -1)}")
MAX_TOKENS=${MAX_TOKENS:-64}
ROUNDS=${ROUNDS:-3}
OUT=${OUT:-.tlaloc/bench/vllm-serve}
gguf=.tlaloc/models/SmolLM2-135M-Instruct.Q4_1.gguf
artifact=$OUT/smollm2-f32
[ -x "$venv/bin/python" ] || { echo "missing $venv: run \`bash tests/vllm/run.sh\` once" >&2; exit 1; }
[ -f "$gguf" ] || { echo "missing $gguf: run \`bash scripts/setup.sh\`" >&2; exit 1; }
mkdir -p "$OUT"

cargo build --quiet --release -p tlaloc
tlaloc=target/release/tlaloc
echo "== the plugin, release build, into $venv" >&2
PATH="$PWD/$venv/bin:$PATH" "$venv/bin/pip" install --quiet --disable-pip-version-check \
  --no-build-isolation --force-reinstall --no-deps ./python/vllm-tlaloc
# The test lane installs a dev build; make it rebuild its own next time.
rm -f "$venv/vllm-tlaloc.installed"
"$tlaloc" export --checkpoint "$gguf" --out "$artifact" --dtype f32 --batch-buckets 1,4,8,16 \
  --context-buckets 256 --prefill-chunk 128 --force > /dev/null

load() { # URL-or-server-args... ; prints loadtest's report
  "$venv/bin/python" tests/server/loadtest.py --max-tokens "$MAX_TOKENS" "$@"
}
{
  echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs);" \
    "load average at start: $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%F)"
  echo "plugin: $plugin"
  for c in 1 16; do
    for r in $(seq "$ROUNDS"); do
      echo "== tlaloc serve, concurrency $c, run $r"
      load --tlaloc "$tlaloc" --plugin "$plugin" --artifact "$artifact" --concurrency "$c"
    done
  done
  port=$("$venv/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  TLALOC_PJRT_PLUGIN_PATH=$plugin "$venv/bin/vllm" serve \
    "$artifact/tokenizer" --host 127.0.0.1 --port "$port" --served-model-name loadtest \
    --max-num-seqs 16 --max-num-batched-tokens 128 --enable-prefix-caching \
    > "$OUT/vllm-serve.log" 2>&1 &
  vllm_pid=$!
  trap 'kill $vllm_pid 2>/dev/null || true' EXIT
  started=$(date +%s.%N)
  until curl -sf "http://127.0.0.1:$port/v1/models" > /dev/null; do
    kill -0 "$vllm_pid" 2>/dev/null || { tail -30 "$OUT/vllm-serve.log" >&2; exit 1; }
    sleep 0.5
  done
  echo "vllm serve ready after $(python3 -c "import time; print(round(time.time() - $started, 1))") s"
  for c in 1 16; do
    for r in $(seq "$ROUNDS"); do
      echo "== vllm serve (vllm-tlaloc), concurrency $c, run $r"
      load --url "http://127.0.0.1:$port" --concurrency "$c"
    done
  done
} 2>&1 | tee "$OUT/report.txt"
