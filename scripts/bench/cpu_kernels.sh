#!/usr/bin/env bash
# The CPU kernels against the portable bodies: SmolLM2-135M-Instruct exported with the `cpu`
# body variant (f32 and bf16), then `tlaloc bench` with `--kernels auto` and `--kernels portable`
# on each CPU plugin, alternating, ROUNDS times, so both see the same machine. Decode at batch 1
# and 8 after a 128-token prompt (prefilled by the 128-token chunk, which has no variant), and a
# 16-token prompt (the 16-token chunk, which has one). Writes one JSON line per run to
# OUT/runs.jsonl and prints a table of the medians (ms per decode step, ratio to the floor).
# Usage: bash scripts/bench/cpu_kernels.sh OUT [ROUNDS]
# Needs `bash scripts/setup.sh` (plugins and the model); TLALOC picks the binary.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:?usage: cpu_kernels.sh OUT [ROUNDS]}
ROUNDS=${2:-3}
TLALOC=${TLALOC:-target/release/tlaloc}
GGUF=.tlaloc/models/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$GGUF" ] || { echo "missing $GGUF: run \`bash scripts/setup.sh\`" >&2; exit 1; }
[ -x "$TLALOC" ] || cargo build --quiet --release -p tlaloc
mkdir -p "$OUT"
: > "$OUT/runs.jsonl"

for dtype in f32 bf16; do
  "$TLALOC" export --checkpoint "$GGUF" --out "$OUT/smollm2-$dtype" --dtype "$dtype" \
    --max-batch 8 --max-context 256 --prefill-chunk 16,128 --variants cpu --force >/dev/null
done

for round in $(seq "$ROUNDS"); do
  for plugin in .tlaloc/plugins/*/*.so; do
    for dtype in f32 bf16; do
      for kernels in auto portable; do
        for prompt in 128 16; do
          "$TLALOC" bench --artifact "$OUT/smollm2-$dtype" --plugin "$plugin" --batch 1,8 \
            --prompt-len "$prompt" --gen-len 64 --compile-cache "$OUT/compile-cache" \
            --kernels "$kernels" --json 2>/dev/null |
            python3 -c 'import json, sys
d = json.load(sys.stdin)
d["round"], d["dtype"], d["kernels"], d["prompt"] = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
d["artifact"] = d["artifact"].rstrip("/").rsplit("/", 1)[-1]
d["load_average"] = open("/proc/loadavg").read().split()[0]
print(json.dumps(d))' "$round" "$dtype" "$kernels" "$prompt" >> "$OUT/runs.jsonl"
        done
      done
    done
  done
done

python3 - "$OUT/runs.jsonl" <<'PY'
import collections, json, os, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
cells = collections.defaultdict(list)
for r in runs:
    plugin = os.path.basename(os.path.dirname(r["plugin"]))
    for b in r["batches"]:
        key = (plugin, r["dtype"], b["batch"])
        cells[key + (r["kernels"], r["prompt"])].append(b)
print("| plugin | dtype | batch | decode ms/step kernels | portable | kernels/floor | portable/floor | prefill 16 ms kernels | portable | prefill 128 ms kernels | portable |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
med = lambda xs: statistics.median(xs) if xs else float("nan")
for key in sorted({k[:3] for k in cells}):
    def decode(kernels):
        bs = cells[key + (kernels, 128)] + cells[key + (kernels, 16)]
        return med([b["decode"]["wall_ms_per_step"] for b in bs]), med([b["decode"]["ratio_to_floor"] for b in bs])
    def prefill(kernels, prompt):
        return med([b["prefill"]["ms_per_prompt"] for b in cells[key + (kernels, prompt)]])
    (dk, rk), (dp, rp) = decode("auto"), decode("portable")
    print(f"| {key[0]} | {key[1]} | {key[2]} | {dk:.1f} | {dp:.1f} | {rk:.2f} | {rp:.2f} | "
          f"{prefill('auto', 16):.1f} | {prefill('portable', 16):.1f} | {prefill('auto', 128):.1f} | {prefill('portable', 128):.1f} |")
loads = sorted(float(r["load_average"]) for r in runs)
print(f"\n{len(runs)} runs; load average {loads[0]:.2f} to {loads[-1]:.2f}")
PY
