#!/usr/bin/env bash
# Start-up on a fresh machine: `tlaloc bench`'s ready time (process start to ready) with an
# empty compile cache (a new directory each run), first when every entry is compiled, then
# after `tlaloc compile` when every entry comes from the executables shipped in the artifact.
# Works with any plugin (cpu, cuda, a path).
# Usage: bash scripts/bench_startup.sh ARTIFACT PLUGIN [RUNS]
# ARTIFACT is modified: `tlaloc compile` adds (or replaces) this plugin's executables in it.
# TLALOC picks the binary (default target/release/tlaloc). Prints one line per run; with
# KEEP_JSON=DIR each run's whole bench JSON is kept there too.
set -euo pipefail
ARTIFACT=${1:?usage: bench_startup.sh ARTIFACT PLUGIN [RUNS]}
PLUGIN=${2:?usage: bench_startup.sh ARTIFACT PLUGIN [RUNS]}
RUNS=${3:-3}
TLALOC=${TLALOC:-target/release/tlaloc}

bench=("$TLALOC" bench --artifact "$ARTIFACT" --plugin "$PLUGIN" --batch 1 --prompt-len 8
  --gen-len 4 --json)
CACHES=$(mktemp -d)
trap 'rm -rf "$CACHES"' EXIT
summary() {
  if [ -n "${KEEP_JSON:-}" ]; then
    mkdir -p "$KEEP_JSON"
    tee "$KEEP_JSON/$(echo "$1" | tr -c 'a-z0-9\n' '-').json"
  else
    cat
  fi | python3 -c '
import json, sys
d = json.load(sys.stdin)
l = d["load"]
print("%s: ready %.0f ms (load %.0f ms, compile phase %.0f ms; %d compiled, %d from the artifact)"
      % (sys.argv[1], d["ready_ms"], l["total_ms"], l["compile_ms"], l["compiled"], l["from_artifact"]))
if l.get("executables"):
    print("    " + l["executables"])
' "$1"
}
for i in $(seq "$RUNS"); do
  "${bench[@]}" --compile-cache "$CACHES/cold-$i" --no-artifact-executables |
    summary "cold compile, run $i"
done
"$TLALOC" compile "$ARTIFACT" --plugin "$PLUGIN" --no-compile-cache
for i in $(seq "$RUNS"); do
  "${bench[@]}" --compile-cache "$CACHES/shipped-$i" | summary "shipped executables, run $i"
done
# A second start on the same machine: the plugin's hash is remembered in the compile cache.
"${bench[@]}" --compile-cache "$CACHES/shipped-1" | summary "shipped executables, second start"
