#!/usr/bin/env bash
# The GPU lane: correctness against transformers on the same GPU, then decode and prefill speed
# of `tlaloc bench` beside transformers' static-cache generate and the copy-bandwidth floor.
#
# Run on a machine with an NVIDIA GPU whose python3 has torch and transformers and whose
# site-packages hold the CUDA PJRT plugin (discovery finds it):
#   TLALOC=target/release/tlaloc bash scripts/gpu/lane.sh OUT_DIR [correctness|speed|kvq|all] [SHAPES]
# SHAPES: comma list of tinyllama-1.1b,llama3-8b (speed part). `kvq` (not part of `all`): bf16,
# int8 and fp8 K/V pools at the TinyLlama-1.1B shape, decode step time at batch 64 and 128,
# context 2048, and the fp8 pools' greedy agreement with f32 pools. Model files are made there, in
# $TLALOC_GPU_WORK (default /tmp/tlaloc-gpu), never copied in.
# LANE_SECONDS bounds the whole run: transformers' baseline, the last and slowest part, gets
# what is left (its finished rows stay in hf-SHAPE.log). HF_GEN and HF_REPEATS (default 64 and
# 2) trade the baseline's precision for time on large shapes.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$(realpath -m "${1:?usage: lane.sh OUT_DIR [correctness|speed|kvq|all] [SHAPES]}")
part=${2:-all}
shapes=${3:-tinyllama-1.1b,llama3-8b}
TLALOC=$(realpath "${TLALOC:-target/release/tlaloc}")
work=${TLALOC_GPU_WORK:-/tmp/tlaloc-gpu}
export TLALOC_HOME=$work/home
mkdir -p "$out" "$work" "$TLALOC_HOME"
log() { echo "== $(date +%T) $*"; }
deadline=$(( $(date +%s) + ${LANE_SECONDS:-86400} ))
left() { echo $(( deadline - $(date +%s) )); }

log "device"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
"$TLALOC" plugin check cuda 2>&1 | tee "$out/plugin-check.txt"
python3 scripts/gpu/bandwidth.py | tee "$out/bandwidth.json"
gbps=$(python3 -c "import json;print(json.load(open('$out/bandwidth.json'))['bandwidth_bytes_per_s']/1e9)")

if [ "$part" = correctness ] || [ "$part" = all ]; then
  log "correctness: tiny random Llama, f32 and bf16, against transformers on this GPU"
  prompts='[[1,5,9,33,2,7,100],[1],[1,300,301,302,303,304,305,306,307,308,309,310,311,312,313,314,315,316,317,318,319,320,321,322,323,324,325,326,327,328,329,330,331,332,333,334,335,336,337]]'
  for dtype in float32 bfloat16; do
    model=$work/tiny-$dtype
    python3 scripts/gpu/make_random_llama.py --shape tiny --dtype "$dtype" --out "$model"
    short=$([ "$dtype" = float32 ] && echo f32 || echo bf16)
    "$TLALOC" export --checkpoint "$model" --out "$work/tiny-$short.tlaloc" --dtype "$short" \
      --max-batch 4 --max-context 256 --prefill-chunk 64 --force > "$out/export-tiny-$short.txt" 2>&1
    python3 scripts/gpu/hf_baseline.py --model "$model" --dtype "$dtype" \
      --oracle-prompts "$prompts" --oracle-new-tokens 32 | grep '^RESULT ' | sed 's/^RESULT //' \
      > "$out/hf-tiny-$short.json"
    python3 - "$prompts" "$out/hf-tiny-$short.json" "$TLALOC" "$work/tiny-$short.tlaloc" "$short" \
      > "$out/agree-tiny-$short.json" <<'PY'
import json, subprocess, sys
prompts = json.loads(sys.argv[1]); hf = json.load(open(sys.argv[2]))
rows = []
for prompt, want in zip(prompts, hf["greedy"]):
    got = json.loads(subprocess.run(
        [sys.argv[3], "generate", "--artifact", sys.argv[4], "--plugin", "cuda", "--prompt-ids",
         ",".join(map(str, prompt)), "--max-new-tokens", str(len(want)), "--ignore-eos", "--json"],
        check=True, capture_output=True, text=True).stdout)["generated_ids"]
    agree = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    rows.append({"prompt_len": len(prompt), "agree": agree, "of": len(want), "tlaloc": got, "hf": want})
print(json.dumps({"dtype": sys.argv[5], "cases": rows}))
print(sys.argv[5], [f"{r['agree']}/{r['of']}" for r in rows], file=sys.stderr)
PY
  done
fi

if [ "$part" = speed ] || [ "$part" = all ]; then
  for shape in ${shapes//,/ }; do
    model=$work/$shape-bf16
    log "speed: $shape bf16 — make weights"
    python3 scripts/gpu/make_random_llama.py --shape "$shape" --dtype bfloat16 --out "$model"
    artifact=$work/$shape.tlaloc
    log "speed: $shape — export"
    /usr/bin/time -v "$TLALOC" export --checkpoint "$model" --out "$artifact" --dtype bf16 \
      --batch-buckets 1,8,32,64,128 --context-buckets 512,2048 --block-size 16 \
      --prefill-chunk 512,2048 --force \
      > "$out/export-$shape.txt" 2>&1 || { tail -20 "$out/export-$shape.txt"; exit 1; }
    rm -rf "$TLALOC_HOME/compile-cache"
    # Enough generated tokens that every row is prefilled (one prompt a step, between decode
    # steps) before the first row finishes, so that decode steps with all rows exist.
    for context in 512 2048; do
      gen=$([ "$context" = 512 ] && echo 192 || echo 512)
      log "speed: $shape — tlaloc bench, context $context"
      "$TLALOC" bench --artifact "$artifact" --plugin cuda --batch 1,8,32,64,128 \
        --prompt-len $((context - gen)) --gen-len "$gen" --bandwidth-gbps "$gbps" --json \
        > "$out/bench-$shape-c$context.json" 2> "$out/bench-$shape-c$context.log" \
        || tail -20 "$out/bench-$shape-c$context.log"
    done
    # The same decode with every step's tokens read back on the host (no decode chains).
    if [ "$shape" = tinyllama-1.1b ]; then
      log "speed: $shape — tlaloc bench, context 512, decode chains off"
      "$TLALOC" bench --artifact "$artifact" --plugin cuda --batch 1,64 --max-decode-chain 1 \
        --prompt-len 320 --gen-len 192 --bandwidth-gbps "$gbps" --json \
        > "$out/bench-$shape-c512-nochain.json" 2> "$out/bench-$shape-c512-nochain.log" \
        || tail -20 "$out/bench-$shape-c512-nochain.log"
    fi
    # 2040: the longest prompt that leaves room for 8 new tokens in the 2048 bucket.
    for prompt in 128 512 2040; do
      "$TLALOC" bench --artifact "$artifact" --plugin cuda --batch 1 \
        --prompt-len "$prompt" --gen-len 8 --bandwidth-gbps "$gbps" --json \
        > "$out/prefill-$shape-p$prompt.json" 2>> "$out/prefill-$shape.log" || true
    done
    # The peers on the same weights, batches and decode positions: a plain JAX paged forward and
    # a compiled torch step in a CUDA graph (TORCH_COMPILE_MODE). Each gets PEER_SECONDS (default
    # 150) of what is left, keeping 60 s for transformers; a peer that fails or runs out of time
    # is logged, not fatal (the rows it finished stay in PEER-SHAPE.json).
    for peer in jax torch; do
      budget=$(( $(left) - 60 < ${PEER_SECONDS:-150} ? $(left) - 60 : ${PEER_SECONDS:-150} ))
      if [ "$budget" -lt 30 ]; then
        log "speed: $shape — peer $peer skipped: ${budget}s left for it"
        continue
      fi
      log "speed: $shape — peer $peer (${budget}s)"
      extra=""
      [ "$peer" = torch ] && extra="--compile-mode ${TORCH_COMPILE_MODE:-max-autotune-no-cudagraphs}"
      # shellcheck disable=SC2086
      timeout "$budget" python3 "scripts/gpu/peer_$peer.py" --model "$model" $extra \
        --batches 1,8,32,64,128 --contexts 512,2048 --time-budget $(( budget * 3 / 4 )) \
        --reference-cache "$work/peer-reference-$shape.npz" \
        > "$out/$peer-$shape.log" 2>&1 \
        || log "speed: $shape — peer $peer failed (rc $?), see $peer-$shape.log"
      grep '^RESULT ' "$out/$peer-$shape.log" | sed 's/^RESULT //' > "$out/$peer-$shape.json" || true
    done
    log "speed: $shape — transformers generate (static cache)"
    timeout "$(( $(left) > 10 ? $(left) - 10 : 1 ))" python3 scripts/gpu/hf_baseline.py \
      --model "$model" --dtype bfloat16 --batches 1,8,32,64,128 --contexts 512,2048 \
      --gen "${HF_GEN:-64}" --repeats "${HF_REPEATS:-2}" > "$out/hf-$shape.log" 2>&1 || true
    grep '^RESULT ' "$out/hf-$shape.log" | sed 's/^RESULT //' > "$out/hf-$shape.json" || true
  done
fi
if [ "$part" = kvq ]; then
  # Agreement first (small and quick): a tiny random Llama in f32 with f32, int8 and fp8 pools;
  # each prompt's greedy ids from the quantized pools against those of the f32 pools.
  log "kvq: tiny random Llama, f32 weights, f32 / int8 / fp8 K/V pools"
  model=$work/tiny-float32
  python3 scripts/gpu/make_random_llama.py --shape tiny --dtype float32 --out "$model"
  for kv in f32 int8 fp8; do
    "$TLALOC" export --checkpoint "$model" --out "$work/tiny-kv-$kv.tlaloc" --dtype f32 \
      --kv-dtype "$kv" --max-batch 4 --max-context 256 --prefill-chunk 64 --force \
      > "$out/export-tiny-kv-$kv.txt" 2>&1 || { tail -20 "$out/export-tiny-kv-$kv.txt"; exit 1; }
  done
  python3 - "$TLALOC" "$work" > "$out/kvq-agreement.json" <<'PY'
import json, subprocess, sys
tlaloc, work = sys.argv[1], sys.argv[2]
prompts = [[1, 5, 9, 33, 2, 7, 100], [1], list(range(300, 338)), [1, 2, 3, 4] * 16]
def greedy(kv, prompt):
    run = subprocess.run(
        [tlaloc, "generate", "--artifact", f"{work}/tiny-kv-{kv}.tlaloc", "--plugin", "cuda",
         "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens", "64", "--ignore-eos",
         "--json"], capture_output=True, text=True)
    if run.returncode != 0:
        return {"error": run.stderr.strip()[-2000:]}
    return json.loads(run.stdout)["generated_ids"]
rows = []
for prompt in prompts:
    ref = greedy("f32", prompt)
    row = {"prompt_len": len(prompt), "f32": ref}
    for kv in ["int8", "fp8"]:
        got = greedy(kv, prompt)
        row[kv] = got
        if isinstance(got, list) and isinstance(ref, list):
            row[f"{kv}_agree"] = next(
                (i for i, (a, b) in enumerate(zip(got, ref)) if a != b), min(len(got), len(ref)))
    rows.append(row)
print(json.dumps({"cases": rows}))
for r in rows:
    print("prompt", r["prompt_len"], "int8", r.get("int8_agree"), "fp8", r.get("fp8_agree"),
          "of 64", file=sys.stderr)
PY
  shape=tinyllama-1.1b
  model=$work/$shape-bf16
  log "kvq: $shape bf16 — make weights"
  python3 scripts/gpu/make_random_llama.py --shape "$shape" --dtype bfloat16 --out "$model"
  for kv in bf16 int8 fp8; do
    artifact=$work/$shape-kv-$kv.tlaloc
    log "kvq: $shape — export with $kv K/V pools"
    "$TLALOC" export --checkpoint "$model" --out "$artifact" --dtype bf16 --kv-dtype "$kv" \
      --batch-buckets 64,128 --context-buckets 2048 --block-size 16 --prefill-chunk 512 --force \
      > "$out/export-$shape-kv-$kv.txt" 2>&1 || { tail -20 "$out/export-$shape-kv-$kv.txt"; exit 1; }
    "$TLALOC" inspect "$artifact" > "$out/inspect-$shape-kv-$kv.txt" 2>&1 || true
    rm -rf "$TLALOC_HOME/compile-cache"
    # 1536 prompt + 512 generated tokens: the decode steps run at contexts up to 2048.
    log "kvq: $shape — tlaloc bench, $kv pools, batch 64 and 128, context 2048"
    "$TLALOC" bench --artifact "$artifact" --plugin cuda --batch 64,128 \
      --prompt-len 1536 --gen-len 512 --bandwidth-gbps "$gbps" --json \
      > "$out/bench-$shape-kv-$kv.json" 2> "$out/bench-$shape-kv-$kv.log" \
      || tail -20 "$out/bench-$shape-kv-$kv.log"
  done
fi
log "done"
