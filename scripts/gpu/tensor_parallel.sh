#!/usr/bin/env bash
# Tensor parallelism on a machine with several GPUs: for the TinyLlama and Llama-3-8B shapes
# (bf16, random weights), the artifact exported at degree 1 and at each of DEGREES, then per
# degree greedy ids of `tlaloc generate` (32 tokens, ignore EOS) and `tlaloc bench` decode at
# batch 1 and 64 (context 512, prompts of 320, 192 generated), with the copy-bandwidth floor of
# one device (a TP=N step reads 1/N of the weights on each device, so its floor is the one-device
# floor over N). Ids of every degree are compared with degree 1; the summary goes to
# OUT/tensor-parallel.txt, the raw JSON beside it. A degree above the GPU count is skipped, said.
# Run on the GPU machine (ask the device tool's status for a multi-GPU kind first):
#   TLALOC=target/release/tlaloc bash scripts/gpu/tensor_parallel.sh OUT_DIR [DEGREES]
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$(realpath -m "${1:?usage: tensor_parallel.sh OUT_DIR [DEGREES]}")
degrees=${2:-2,4}
TLALOC=$(realpath "${TLALOC:-target/release/tlaloc}")
work=${TLALOC_GPU_WORK:-/tmp/tlaloc-gpu}/tensor-parallel
export TLALOC_HOME=$work/home
mkdir -p "$out" "$work"
gpus=$(nvidia-smi -L | wc -l)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
python3 scripts/gpu/bandwidth.py > "$out/bandwidth.json"
gbps=$(python3 -c "import json;print(json.load(open('$out/bandwidth.json'))['bandwidth_bytes_per_s']/1e9)")
for shape in tinyllama-1.1b llama3-8b; do
  python3 scripts/gpu/make_random_llama.py --shape "$shape" --dtype bfloat16 --out "$work/$shape"
  for tp in 1 ${degrees//,/ }; do
    if [ "$tp" -gt "$gpus" ]; then echo "$shape: TP=$tp skipped: $gpus GPUs here" | tee -a "$out/tensor-parallel.txt"; continue; fi
    artifact=$work/$shape-tp$tp
    "$TLALOC" export --checkpoint "$work/$shape" --out "$artifact" --dtype bf16 --tensor-parallel "$tp" \
      --batch-buckets 1,64 --context-buckets 512 --prefill-chunk 512 --force > "$out/export-$shape-tp$tp.txt" 2>&1
    "$TLALOC" generate --artifact "$artifact" --plugin cuda --prompt-ids 1,450,4996,17354,1701 \
      --max-new-tokens 32 --ignore-eos --json > "$out/generate-$shape-tp$tp.json"
    "$TLALOC" bench --artifact "$artifact" --plugin cuda --batch 1,64 --prompt-len 320 --gen-len 192 \
      --bandwidth-gbps "$gbps" --json > "$out/bench-$shape-tp$tp.json"
  done
done
python3 - "$out" "$degrees" <<'PY' | tee -a "$out/tensor-parallel.txt"
import json, os, sys
out, degrees = sys.argv[1], [int(d) for d in sys.argv[2].split(",")]
for shape in ("tinyllama-1.1b", "llama3-8b"):
    load = lambda kind, tp: json.load(open(f"{out}/{kind}-{shape}-tp{tp}.json"))
    base = load("generate", 1)["generated_ids"]
    for tp in [1] + degrees:
        if not os.path.exists(f"{out}/bench-{shape}-tp{tp}.json"):
            continue
        ids = load("generate", tp)["generated_ids"]
        same = sum(1 for a, b in zip(ids, base) if a == b) if ids != base else len(ids)
        print(f"{shape} TP={tp}: ids {'equal to TP=1' if ids == base else f'differ from TP=1 after {same} equal'}")
        for b in load("bench", tp)["batches"]:
            d = b["decode"]
            floor = d.get("floor_ms")
            print(f"  batch {b['batch']}: decode {d['wall_ms_per_step']:.3f} ms/step"
                  + (f", one-device floor {floor:.3f} ms, floor/TP {floor / tp:.3f} ms" if floor else ""))
PY
