#!/usr/bin/env bash
# The CPU-variant artifact on the CUDA plugin: the variant is refused by platform, the portable
# bodies run, and the ids equal --kernels portable's. Usage on the GPU machine, from the checkout:
# OUT=DIR TLALOC=path/to/tlaloc bash scripts/gpu/variant_fallback.sh
set -uo pipefail
T=${TLALOC:-.carry/tlaloc}
A=$OUT/tiny-variant
nvidia-smi --query-gpu=name --format=csv,noheader
$T export --checkpoint tests/data/fixtures/tiny-llama-gqa --out $A --max-batch 2 --max-context 128 --prefill-chunk 16 --variants cpu --force > $OUT/export.txt 2>&1
for k in auto portable; do
  $T generate --artifact $A --plugin cuda --no-compile-cache --prompt-ids 1,2,3,4,5 --max-new-tokens 12 --ignore-eos --json --kernels $k > $OUT/gen-$k.json 2> $OUT/gen-$k.err
  echo "kernels $k rc=$?"
done
python3 - <<'PY'
import json, os
o = os.environ["OUT"]
a, p = (json.load(open(f"{o}/gen-{k}.json")) for k in ("auto", "portable"))
print("auto bodies:", a["timings"]["load"]["bodies"])
print("portable bodies:", p["timings"]["load"]["bodies"])
print("ids equal:", a["generated_ids"] == p["generated_ids"], a["generated_ids"])
PY
