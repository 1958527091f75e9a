#!/usr/bin/env bash
# Kernel by kernel, Tlaloc's decode step against the plain JAX paged step (peer_jax.py) at the
# batches where JAX was faster (8 and 64; TinyLlama shape, bf16, context bucket 512, pools of
# exactly batch x 512 tokens in both). Nsight Compute times every kernel of STEPS decode steps
# of each; the per-step table of each side goes to OUT/ncu-{tlaloc,jax}-bB.csv and the summary
# (kernels per step, ms per step, the largest kernels, grouped by XLA's fusion kind) to
# OUT/profile-batch.txt. Tlaloc runs `bench` with one-token prompts on an artifact whose ladder
# has one decode batch, so every decode row goes to that entry and no prefill entry runs.
#   TLALOC=target/release/tlaloc bash scripts/gpu/profile_batch.sh OUT_DIR [BATCHES]
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$(realpath -m "${1:?usage: profile_batch.sh OUT_DIR [BATCHES]}")
batches=${2:-8,64}
TLALOC=$(realpath "${TLALOC:-target/release/tlaloc}")
work=${TLALOC_GPU_WORK:-/tmp/tlaloc-gpu}/profile-batch
export TLALOC_HOME=$work/home
mkdir -p "$out" "$work"
steps=4
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
[ -d "$work/model" ] || python3 scripts/gpu/make_random_llama.py --shape tinyllama-1.1b --dtype bfloat16 --out "$work/model"
for b in ${batches//,/ }; do
  "$TLALOC" export --checkpoint "$work/model" --out "$work/b$b" --dtype bf16 \
    --batch-buckets "$b" --context-buckets 512 --prefill-chunk 128 --force > /dev/null
  bench=(bench --artifact "$work/b$b" --plugin cuda --batch "$b" --prompt-len 1 --max-decode-chain 1)
  XLA_FLAGS="--xla_dump_to=$work/dump-tlaloc-b$b --xla_dump_hlo_as_text" "$TLALOC" "${bench[@]}" --gen-len 4 --compile-cache "$work/cache-dump" > /dev/null
  "$TLALOC" "${bench[@]}" --gen-len 4 --compile-cache "$work/cache" > "$out/bench-b$b.txt"
  "$ncu" --clock-control none --metrics gpu__time_duration.sum --csv --launch-count 20000 \
    "$TLALOC" "${bench[@]}" --gen-len "$steps" --no-warmup --compile-cache "$work/cache" > "$out/ncu-tlaloc-b$b.csv" 2> "$work/ncu-tlaloc.err" || tail -5 "$work/ncu-tlaloc.err"
  jax=(python3 scripts/gpu/profile_jax.py --model "$work/model" --batch "$b" --steps "$steps" --cache "$work/jax-cache")
  XLA_FLAGS="--xla_dump_to=$work/dump-jax-b$b --xla_dump_hlo_as_text" "${jax[@]}" --cache "$work/jax-cache-dump"
  "${jax[@]}"
  "$ncu" --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv \
    "${jax[@]}" > "$out/ncu-jax-b$b.csv" 2> "$work/ncu-jax.err" || tail -5 "$work/ncu-jax.err"
done
(cd "$work" && tar czf "$out/hlo-batch.tgz" $(find dump-* -name '*after_optimizations.txt' | head -60))
python3 scripts/gpu/summarize_profile.py "$out" "$steps" ${batches//,/ } | tee "$out/profile-batch.txt"
