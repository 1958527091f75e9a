#!/usr/bin/env bash
# Before and after a graph change, in one machine call: two `tlaloc` binaries each export the same
# random-weight TinyLlama-shape bf16 checkpoint with the same ladder and run the same decode
# benches, alternating A, B, A, B so that drift of the machine shows as a difference between
# the two runs of one binary. Then Nsight Compute's kernel count and GPU time per batch-1 step
# for each binary (scripts/gpu/profile.sh). The bench JSON of every run lands in OUT_DIR.
#   bash scripts/gpu/compare_binaries.sh OUT_DIR BINARY_A BINARY_B
# COMPARE_BATCHES (default 1,8,64,128), COMPARE_ROUNDS (default 2), COMPARE_PROFILE=0 (no profiles).
# COMPARE_UPDATES=1 also checks that both binaries generate the same 96 greedy tokens from one
# prompt, and counts XLA's command-buffer updates (and the allocations each changed) against its
# executions over a batch-8 bench of each (TF_CPP_VMODULE=command_buffer_thunk=3).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$(realpath -m "${1:?usage: compare_binaries.sh OUT_DIR BINARY_A BINARY_B}")
a=$(realpath "${2:?binary A}")
b=$(realpath "${3:?binary B}")
work=${TLALOC_GPU_WORK:-/tmp/tlaloc-gpu}
export TLALOC_HOME=$work/home
mkdir -p "$out" "$work" "$TLALOC_HOME"
log() { echo "== $(date +%T) $*"; }
batches=${COMPARE_BATCHES:-1,8,64,128}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
python3 scripts/gpu/bandwidth.py | tee "$out/bandwidth.json"
gbps=$(python3 -c "import json;print(json.load(open('$out/bandwidth.json'))['bandwidth_bytes_per_s']/1e9)")
model=$work/tinyllama-1.1b-bf16
python3 scripts/gpu/make_random_llama.py --shape tinyllama-1.1b --dtype bfloat16 --out "$model"
for side in a b; do
  bin=${!side}
  log "export with $side ($bin)"
  "$bin" export --checkpoint "$model" --out "$work/$side.tlaloc" --dtype bf16 \
    --batch-buckets "$batches" --context-buckets 512 --block-size 16 --prefill-chunk 512 \
    --force > "$out/export-$side.txt" 2>&1 || { tail -20 "$out/export-$side.txt"; exit 1; }
done
for round in $(seq "${COMPARE_ROUNDS:-2}"); do
  for side in a b; do
    bin=${!side}
    log "bench $side, round $round"
    "$bin" bench --artifact "$work/$side.tlaloc" --plugin cuda --batch "$batches" \
      --prompt-len 320 --gen-len 192 --bandwidth-gbps "$gbps" --json \
      > "$out/bench-$side-$round.json" 2> "$out/bench-$side-$round.log" \
      || tail -20 "$out/bench-$side-$round.log"
  done
done
python3 - "$out" "$batches" <<'PY'
import json, sys
out, batches = sys.argv[1], [int(x) for x in sys.argv[2].split(",")]
def rows(path):
    try:
        bench = json.load(open(path))
    except (OSError, ValueError):
        return {}
    return {r["batch"]: r["decode"] for r in bench["batches"]}
print("| batch | A ms/step (runs) | B ms/step (runs) | B / A |")
print("|---|---|---|---|")
for batch in batches:
    got = {}
    for side in "ab":
        got[side] = [rows(f"{out}/bench-{side}-{r}.json").get(batch, {}).get("wall_ms_per_step") for r in (1, 2, 3)]
    a = [x for x in got["a"] if x]; b = [x for x in got["b"] if x]
    ratio = f"{(sum(b) / len(b)) / (sum(a) / len(a)):.3f}" if a and b else "-"
    print(f"| {batch} | {', '.join(f'{x:.3f}' for x in a)} | {', '.join(f'{x:.3f}' for x in b)} | {ratio} |")
PY
if [ "${COMPARE_UPDATES:-0}" = 1 ]; then
  prompt=$(python3 -c "print(','.join(str(3 + 7 * i % 31000) for i in range(100)))")
  for side in a b; do
    bin=${!side}
    log "same tokens and command-buffer updates, $side"
    "$bin" generate --artifact "$work/$side.tlaloc" --plugin cuda --prompt-ids "$prompt" \
      --max-new-tokens 96 --ignore-eos --json > "$out/generate-$side.json" 2> "$out/generate-$side.log" \
      || tail -5 "$out/generate-$side.log"
    TF_CPP_MIN_LOG_LEVEL=0 TF_CPP_VMODULE=command_buffer_thunk=3 "$bin" bench --artifact "$work/$side.tlaloc" \
      --plugin cuda --batch 8 --prompt-len 320 --gen-len 32 --json > "$out/updates-$side.json" 2> "$out/updates-$side.log" \
      || tail -5 "$out/updates-$side.log"
    echo "$side: $(grep -c 'Update command buffer' "$out/updates-$side.log") updates," \
      "$(grep -c 'Execute command buffer on device' "$out/updates-$side.log") executions; changed allocations per update:" \
      "$(grep -o 'updated_allocs=[0-9]*' "$out/updates-$side.log" | sort | uniq -c | sort -rn | head -3 | tr '\n' ' ')"
    gzip -f "$out/updates-$side.log"
  done
  python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
a, b = (json.load(open(f"{out}/generate-{s}.json"))["generated_ids"] for s in "ab")
print("generated ids:", "equal" if a == b else f"DIFFER at {next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)}")
PY
fi
for side in $( [ "${COMPARE_PROFILE:-1}" = 1 ] && echo a b ); do
  log "profile $side"
  TLALOC=${!side} TLALOC_GPU_WORK=$work timeout "${PROFILE_SECONDS:-180}" \
    bash scripts/gpu/profile.sh "$out/profile-$side" > "$out/profile-$side.txt" 2>&1 || true
  grep -m1 "per decode step" "$out/profile-$side.txt" || tail -5 "$out/profile-$side.txt"
done
