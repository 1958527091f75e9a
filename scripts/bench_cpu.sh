#!/usr/bin/env bash
# CPU benchmark: `tlaloc bench` on SmolLM2-135M-Instruct f32 and transformers' `generate` on the
# same model, in one go on this machine; decode ms/step at batch 1 and 8 and the prefill of a
# 128-token prompt, as ratios to the bytes-per-step floor and to transformers. Writes the "CPU"
# section of docs/benchmarks.md (raw JSON under .tlaloc/bench/).
# Needs: `bash scripts/setup.sh` (plugins and the model) and the oracle venv
# (`bash scripts/oracle/regenerate.sh` makes .venv-oracle; TLALOC_ORACLE_VENV picks another).
# Options through the environment: PLUGIN (default cpu), BATCH (1,8), PROMPT_LEN (128), GEN_LEN (64).
set -euo pipefail
cd "$(dirname "$0")/.."

PLUGIN=${PLUGIN:-cpu}
BATCH=${BATCH:-1,8}
PROMPT_LEN=${PROMPT_LEN:-128}
GEN_LEN=${GEN_LEN:-64}
VENV=${TLALOC_ORACLE_VENV:-.venv-oracle}
GGUF=.tlaloc/models/SmolLM2-135M-Instruct.Q4_1.gguf
OUT=.tlaloc/bench
ARTIFACT=$OUT/smollm2-f32
LADDER="--max-batch 8 --max-context 256 --prefill-chunk 128"

[ -f "$GGUF" ] || { echo "missing $GGUF: run \`bash scripts/setup.sh\`" >&2; exit 1; }
[ -x "$VENV/bin/python" ] || { echo "missing $VENV: run \`bash scripts/oracle/regenerate.sh\`" >&2; exit 1; }

cargo build --quiet --release -p tlaloc
TLALOC=target/release/tlaloc
mkdir -p "$OUT"
# shellcheck disable=SC2086
"$TLALOC" export --checkpoint "$GGUF" --out "$ARTIFACT" --dtype f32 $LADDER --force >/dev/null

bench=("$TLALOC" bench --artifact "$ARTIFACT" --plugin "$PLUGIN" --batch "$BATCH"
  --prompt-len "$PROMPT_LEN" --gen-len "$GEN_LEN")
rm -rf "$OUT/compile-cache"
echo "tlaloc bench (cold compile cache)..." >&2
"${bench[@]}" --compile-cache "$OUT/compile-cache" --json > "$OUT/tlaloc-cold.json"
echo "tlaloc start-up (warm compile cache)..." >&2
"$TLALOC" bench --artifact "$ARTIFACT" --plugin "$PLUGIN" --batch 1 --prompt-len 8 --gen-len 4 \
  --compile-cache "$OUT/compile-cache" --json > "$OUT/tlaloc-warm.json"
echo "transformers generate..." >&2
"$VENV/bin/python" scripts/bench/hf_generate.py --gguf "$GGUF" --batch "$BATCH" \
  --prompt-len "$PROMPT_LEN" --gen-len "$GEN_LEN" > "$OUT/transformers.json"

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//' || echo unknown)
"$VENV/bin/python" - "$OUT/meta.json" "$(nproc)" "$cpu" "$LADDER" <<'PY'
import datetime, json, sys
json.dump({
    "command": "bash scripts/bench_cpu.sh",
    "date": datetime.date.today().isoformat(),
    "nproc": int(sys.argv[2]),
    "cpu": sys.argv[3],
    "ladder": sys.argv[4],
}, open(sys.argv[1], "w"))
PY
"$VENV/bin/python" scripts/bench/cpu_table.py "$OUT/tlaloc-cold.json" "$OUT/tlaloc-warm.json" \
  "$OUT/transformers.json" "$OUT/meta.json" docs/benchmarks.md
echo "wrote the CPU section of docs/benchmarks.md" >&2
