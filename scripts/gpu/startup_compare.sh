#!/usr/bin/env bash
# Start-up of the Llama-3-8B shape ladder (13 entries, random bf16 weights, executables shipped
# in the artifact by `tlaloc compile`) with two `tlaloc` binaries in one machine call: A, B, A,
# B, ... each run with a new empty compile cache, so drift of the machine shows as a difference
# between the runs of one binary. Both binaries generate greedily from the same artifact, and
# their ids must match. One JSON line per run goes to OUT_DIR/runs.jsonl, a summary to
# OUT_DIR/startup.txt.
#   bash scripts/gpu/startup_compare.sh OUT_DIR BINARY_A BINARY_B
# COMPARE_ROUNDS (default 3); TLALOC_GPU_WORK the scratch directory.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$(realpath -m "${1:?usage: startup_compare.sh OUT_DIR BINARY_A BINARY_B}")
a=$(realpath "${2:?binary A}")
b=$(realpath "${3:?binary B}")
work=${TLALOC_GPU_WORK:-/tmp/tlaloc-gpu}/startup-compare
export TLALOC_HOME=$work/home
mkdir -p "$out" "$work"
log() { echo "== $(date +%T) $*"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
nproc | sed 's/^/cores: /' | tee -a "$out/gpu.txt"
model=$work/llama3-8b
log "random checkpoint"
python3 scripts/gpu/make_random_llama.py --shape llama3-8b --dtype bfloat16 --out "$model" > "$out/make.txt" 2>&1 \
  || { tail "$out/make.txt"; exit 1; }
log "export and compile with A"
"$a" export --checkpoint "$model" --out "$work/l8.tlaloc" --dtype bf16 --batch-buckets 1,8,32,64,128 \
  --context-buckets 512,2048 --block-size 16 --prefill-chunk 512,2048 --force > "$out/export.txt" 2>&1 \
  || { tail "$out/export.txt"; exit 1; }
"$a" compile "$work/l8.tlaloc" --plugin cuda --no-compile-cache 2>&1 | tail -2 | tee "$out/compile.txt"
for side in a b; do
  bin=${!side}
  "$bin" generate --artifact "$work/l8.tlaloc" --plugin cuda --prompt-ids 1,450,4996,17354,1701 \
    --max-new-tokens 16 --ignore-eos --json --compile-cache "$work/cache-generate-$side" \
    > "$out/generate-$side.json" 2> "$out/generate-$side.log" || { tail -5 "$out/generate-$side.log"; exit 1; }
done
for round in $(seq "${COMPARE_ROUNDS:-3}"); do
  for side in a b; do
    bin=${!side}
    log "bench $side, round $round"
    "$bin" bench --artifact "$work/l8.tlaloc" --plugin cuda --batch 1 --prompt-len 8 --gen-len 4 --json \
      --compile-cache "$work/cache-$side-$round" > "$work/r.json" 2> "$out/bench-$side-$round.log" \
      || { tail -5 "$out/bench-$side-$round.log"; continue; }
    python3 - "$work/r.json" "$side" "$round" "$out/runs.jsonl" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["side"], d["round"] = sys.argv[2], int(sys.argv[3])
open(sys.argv[4], "a").write(json.dumps(d) + "\n")
PY
  done
done
python3 - "$out" <<'PY' | tee "$out/startup.txt"
import json, sys
out = sys.argv[1]
ids = {s: json.load(open(f"{out}/generate-{s}.json")).get("generated_ids") for s in "ab"}
print("greedy ids equal:", ids["a"] == ids["b"], ids["a"])
for line in open(f"{out}/runs.jsonl"):
    d = json.loads(line)
    l = d["load"]
    print(f'{d["side"]} round {d["round"]}: ready {d["ready_ms"]:.0f} ms, upload {l["upload_weights_ms"]:.0f} ms '
          f'(read {l["upload_read_thread_ms"]:.0f} / hand-over {l["upload_transfer_thread_ms"]:.0f} thread-ms, '
          f'pinned {l.get("upload_pinned_bytes", 0) / 1e9:.1f} GB), pools {l["allocate_pools_ms"]:.0f} ms, '
          f'compile {l["compile_ms"]:.0f} ms, from artifact {l["from_artifact"]}, compiled {l["compiled"]}')
PY
