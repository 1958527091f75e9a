#!/usr/bin/env bash
# Decode speed of one TinyLlama-shape bf16 artifact (batch 1, context 512) under several XLA GPU
# flag sets, the compile cache bypassed so that every run compiles under its own flags.
#   TLALOC=target/release/tlaloc bash scripts/gpu/xla_flags.sh OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$(realpath -m "${1:?usage: xla_flags.sh OUT_DIR}")
TLALOC=$(realpath "${TLALOC:-target/release/tlaloc}")
work=${TLALOC_GPU_WORK:-/tmp/tlaloc-gpu}/flags
export TLALOC_HOME=$work/home
mkdir -p "$out" "$work"
python3 scripts/gpu/make_random_llama.py --shape tinyllama-1.1b --dtype bfloat16 --out "$work/model"
"$TLALOC" export --checkpoint "$work/model" --out "$work/artifact" --dtype bf16 \
  --batch-buckets 1 --context-buckets 512 --prefill-chunk 128 --force > /dev/null
prompt=$(python3 -c "print(','.join(str(3 + i) for i in range(100)))")
for flags in "" "--xla_gpu_enable_triton_gemm=false" \
  "--xla_gpu_enable_triton_gemm=false --xla_gpu_enable_command_buffer=" \
  "--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,DYNAMIC_SLICE_FUSION,WHILE,CONDITIONAL"; do
  result=$(XLA_FLAGS="$flags" "$TLALOC" generate --artifact "$work/artifact" --plugin cuda \
    --prompt-ids "$prompt" --max-new-tokens 64 --ignore-eos --eager-compile --no-compile-cache --json 2>/dev/null \
    | python3 -c "import json,sys; t=json.load(sys.stdin)['timings']; print(f\"decode {t['decode_ms_per_step']:.3f} ms/step, prefill {t['prefill_ms']:.2f} ms\")" \
    || echo failed)
  echo "flags [$flags]: $result" | tee -a "$out/flags.txt"
done
