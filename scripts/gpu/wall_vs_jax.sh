#!/usr/bin/env bash
# Decode wall time of `tlaloc bench` against the plain JAX paged step (peer_jax.py) on the same
# card in one call: random TinyLlama-shape bf16 weights, batch 1, 8 and 64, context 512 (prompts
# of 320, 192 generated). Tlaloc runs twice before the peer and once after it, so drift shows.
#   TLALOC=target/release/tlaloc bash scripts/gpu/wall_vs_jax.sh OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$(realpath -m "${1:?usage: wall_vs_jax.sh OUT_DIR}")
TLALOC=$(realpath "${TLALOC:-target/release/tlaloc}")
work=${TLALOC_GPU_WORK:-/tmp/tlaloc-gpu}/wall-vs-jax
export TLALOC_HOME=$work/home
mkdir -p "$out" "$work"
python3 scripts/gpu/bandwidth.py > "$out/bandwidth.json"
gbps=$(python3 -c "import json;print(json.load(open('$out/bandwidth.json'))['bandwidth_bytes_per_s']/1e9)")
python3 scripts/gpu/make_random_llama.py --shape tinyllama-1.1b --dtype bfloat16 --out "$work/model" > /dev/null
"$TLALOC" export --checkpoint "$work/model" --out "$work/artifact" --dtype bf16 --batch-buckets 1,8,64 \
  --context-buckets 512 --block-size 16 --prefill-chunk 512 --force > "$out/export.txt" 2>&1
bench() {
  "$TLALOC" bench --artifact "$work/artifact" --plugin cuda --batch 1,8,64 --prompt-len 320 --gen-len 192 \
    --bandwidth-gbps "$gbps" --json > "$out/bench-$1.json" 2> "$out/bench-$1.log"
}
bench 1
bench 2
timeout 200 python3 scripts/gpu/peer_jax.py --model "$work/model" --batches 1,8,64 --contexts 512 \
  --time-budget 150 --reference-cache "$work/reference.npz" > "$out/jax.log" 2>&1 || echo "jax peer rc $?"
grep '^RESULT ' "$out/jax.log" | sed 's/^RESULT //' > "$out/jax.json" || true
bench 3
python3 - "$out" <<'PY'
import glob, json, sys
out = sys.argv[1]
for path in sorted(glob.glob(f"{out}/bench-*.json")):
    for b in json.load(open(path))["batches"]:
        d = b["decode"]
        print(path.rsplit("/", 1)[1], "batch", b["batch"], "%.3f ms/step (%.2fx floor)" % (d["wall_ms_per_step"], d["ratio_to_floor"]))
for line in open(f"{out}/jax.json"):
    r = json.loads(line)
    print("jax batch", r["batch"], "%.3f ms/step, fori_loop %.3f" % (r["decode_ms_per_step"], r["loop_ms_per_step"]))
PY
