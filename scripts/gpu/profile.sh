#!/usr/bin/env bash
# Where a decode step's time goes on the GPU: XLA's optimized HLO of the entries and a per-kernel
# time table from Nsight Compute, for a TinyLlama-shape bf16 artifact at batch 1, context 512,
# with a large page pool (so that any cost that scales with the pool shows). The profiled run
# has a one-token prompt, which goes straight to the decode entry: every kernel counted belongs
# to one of its STEPS decode steps.
#   TLALOC=target/release/tlaloc bash scripts/gpu/profile.sh OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$(realpath -m "${1:?usage: profile.sh OUT_DIR}")
TLALOC=$(realpath "${TLALOC:-target/release/tlaloc}")
work=${TLALOC_GPU_WORK:-/tmp/tlaloc-gpu}/profile
export TLALOC_HOME=$work/home
mkdir -p "$out" "$work"
python3 scripts/gpu/make_random_llama.py --shape tinyllama-1.1b --dtype bfloat16 --out "$work/model"
"$TLALOC" export --checkpoint "$work/model" --out "$work/artifact" --dtype bf16 \
  --batch-buckets 1 --context-buckets 512 --prefill-chunk 128 --num-blocks 8192 --force
prompt=5
steps=5
XLA_FLAGS="--xla_dump_to=$work/dump --xla_dump_hlo_as_text" "$TLALOC" generate \
  --artifact "$work/artifact" --plugin cuda --prompt-ids "$prompt" --max-new-tokens 64 \
  --ignore-eos --eager-compile --json > "$out/generate.json"
# The same run without XLA_FLAGS first: it fills the compile cache (keyed by the flags), so that
# nothing is compiled under Nsight Compute (XLA's autotuner crashes there).
"$TLALOC" generate --artifact "$work/artifact" --plugin cuda --prompt-ids "$prompt" \
  --max-new-tokens 2 --ignore-eos --eager-compile --json > /dev/null
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
"$ncu" --metrics gpu__time_duration.sum --csv --launch-count 4000 "$TLALOC" generate \
  --artifact "$work/artifact" --plugin cuda --prompt-ids "$prompt" --max-new-tokens "$steps" \
  --max-decode-chain 1 --ignore-eos > "$out/ncu.csv" 2> "$out/ncu.err" || tail -5 "$out/ncu.err"
(cd "$work/dump" && tar czf "$out/hlo.tgz" $(ls | grep -E 'after_optimizations\.txt$|buffer-assignment' | head -40))
python3 - "$out/ncu.csv" "$steps" <<'PY'
import csv, collections, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head = rows[0]; rows = rows[1:]
ki = head.index("Kernel Name"); vi = head.index("Metric Value"); ui = head.index("Metric Unit")
total = collections.Counter(); count = collections.Counter()
for r in rows:
    v = float(r[vi].replace(",", "")); unit = r[ui]
    scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
    us = v * scale[unit]
    name = r[ki][:90]; total[name] += us; count[name] += 1
steps = int(sys.argv[2])
print(f"per decode step: {len(rows) / steps:.0f} kernels, {sum(total.values()) / 1e3 / steps:.3f} ms")
for name, us in total.most_common(40):
    print(f"{us / 1e3 / steps:9.4f} ms/step  {count[name] / steps:5.0f}x  {name}")
PY
