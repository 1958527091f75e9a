#!/usr/bin/env bash
# Start-up of the Llama-3-8B shape ladder (13 entries, random bf16 weights) from shipped
# executables, two runs under each GPU allocator setting, each with a new empty compile cache.
# Run on the GPU machine: `OUT=DIR bash scripts/gpu/startup_allocators.sh` (TLALOC picks the
# binary, WORK the scratch directory); one JSON line per run goes to $OUT/runs.jsonl.
set -uo pipefail
T=${TLALOC:-target/release/tlaloc}; W=${WORK:-$(mktemp -d)}; OUT=${OUT:-$W/out}; mkdir -p "$W" "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 scripts/gpu/make_random_llama.py --shape llama3-8b --dtype bfloat16 --out $W/l8 > $OUT/make.txt 2>&1 || { tail $OUT/make.txt; exit 1; }
$T export --checkpoint $W/l8 --out $W/l8.tlaloc --dtype bf16 --batch-buckets 1,8,32,64,128 --context-buckets 512,2048 --block-size 16 --prefill-chunk 512,2048 > $OUT/export.txt 2>&1 || { tail $OUT/export.txt; exit 1; }
$T compile $W/l8.tlaloc --plugin cuda --no-compile-cache 2>&1 | tail -2
b() { name=$1; shift; for i in 1 2; do
  $T bench --artifact $W/l8.tlaloc --plugin cuda --batch 1 --prompt-len 8 --gen-len 4 --json --compile-cache $W/cache-$name-$i "$@" > $W/r.json 2> $W/r.err
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); d["run"]=sys.argv[2]; open(sys.argv[3],"a").write(json.dumps(d)+"\n"); l=d["load"]; print(sys.argv[2], "ready %.0f ms" % d["ready_ms"], {k: l[k] for k in l if k.endswith("_ms")})' $W/r.json $name-$i $OUT/runs.jsonl || { echo "$name-$i failed"; tail -5 $W/r.err | tee -a $OUT/errors.txt; }
done; }
b default
b prealloc45 --gpu-preallocate --gpu-memory-fraction 0.45
b cudaasync --gpu-allocator cuda-async
b platform --gpu-allocator platform
b prealloc75 --gpu-preallocate
