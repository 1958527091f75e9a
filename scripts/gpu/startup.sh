#!/usr/bin/env bash
# Start-up to ready of a TinyLlama-shape bf16 artifact (the lane's 13-entry ladder), with a cold
# and then a warm compile cache.   TLALOC=target/release/tlaloc bash scripts/gpu/startup.sh OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$(realpath -m "${1:?usage: startup.sh OUT_DIR}")
TLALOC=$(realpath "${TLALOC:-target/release/tlaloc}")
work=${TLALOC_GPU_WORK:-/tmp/tlaloc-gpu}
export TLALOC_HOME=$work/startup-home
mkdir -p "$out" "$work"
rm -rf "$TLALOC_HOME/compile-cache"
python3 scripts/gpu/make_random_llama.py --shape tinyllama-1.1b --dtype bfloat16 --out "$work/tinyllama-1.1b-bf16"
"$TLALOC" export --checkpoint "$work/tinyllama-1.1b-bf16" --out "$work/startup.tlaloc" --dtype bf16 \
  --batch-buckets 1,8,32,64,128 --context-buckets 512,2048 --block-size 16 \
  --prefill-chunk 512,2048 --force > /dev/null
for run in cold warm warm; do
  /usr/bin/time -f "$run: process wall %e s" "$TLALOC" generate --artifact "$work/startup.tlaloc" \
    --plugin cuda --prompt-ids 1,2,3 --max-new-tokens 2 --eager-compile --json \
    2> >(grep "process wall" >&2) > "$out/startup-$run.json"
  python3 -c "import json; t=json.load(open('$out/startup-$run.json'))['timings']; l=t['load']; print('$run', {k: round(v) if isinstance(v, float) else v for k, v in l.items()}, 'ready_ms', round(t['ready_ms']))" | tee -a "$out/startup.txt"
done
