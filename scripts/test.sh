#!/usr/bin/env bash
# The test command: installs what the tests need (CPU plugins, the real model, the Python client
# used by the server tests) and runs every test of the workspace on both CPU plugins, a bounded
# run of every fuzz target (where a nightly toolchain is present), and the server suite.
# Every suite runs even when an earlier one fails; the last line counts what passed and failed.
set -uo pipefail
cd "$(dirname "$0")/.."
TLALOC_PROFILE=dev bash scripts/setup.sh || { echo "tests: setup failed"; exit 1; }

log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT

cargo test --workspace --no-fail-fast --quiet 2>&1 | tee "$log/cargo.txt"
cargo_status=${PIPESTATUS[0]}
# The cargo tests' scratch (exported artifacts, ~5 GB) is rebuilt by the next run; the plugin
# lanes below need the disk.
rm -rf target/tmp && mkdir -p target/tmp
FUZZ_SECONDS=${FUZZ_SECONDS:-15} bash scripts/fuzz.sh 2>&1 | tee "$log/fuzz.txt"
fuzz_status=${PIPESTATUS[0]}
bash tests/server/run.sh 2>&1 | tee "$log/server.txt"
server_status=${PIPESTATUS[0]}
# --- vLLM plugin lane: LLM.generate and `vllm serve` through vllm-tlaloc (tests/vllm/run.sh) ---
bash tests/vllm/run.sh 2>&1 | tee "$log/vllm.txt"
vllm_status=${PIPESTATUS[0]}
read -r vllm_passed vllm_failed < <(awk '/ in [0-9.]+s/ && /passed|failed|error/ {
    for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^(failed|errors?)/) f += $i }
  } END { print p + 0, f + 0 }' "$log/vllm.txt")
# --- end of the vLLM plugin lane ---

# --- Triton backend: tests/triton/run.sh (the real tritonserver from the nvidia-pytriton wheel,
# on every plugin); its pytest lines are counted into "triton N passed, M failed".
bash tests/triton/run.sh 2>&1 | tee "$log/triton.txt"
triton_status=${PIPESTATUS[0]}
read -r triton_passed triton_failed < <(awk '/ in [0-9.]+s/ && /passed|failed/ {
    for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^(failed|errors?)/) f += $i }
  } END { print p + 0, f + 0 }' "$log/triton.txt")
# --- end Triton backend

# cargo prints "test result: ok. N passed; M failed; ..." per test binary; pytest prints
# "N passed, M failed in ..." per run; tests/server/run.sh prints "load test result: ..." and
# "soak result: ..." per plugin.
read -r cargo_passed cargo_failed < <(awk '/^test result:/ {
    for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i }
  } END { print p + 0, f + 0 }' "$log/cargo.txt")
read -r py_passed py_failed < <(awk '/ in [0-9.]+s/ && /passed|failed/ {
    for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^(failed|errors?)/) f += $i }
  } END { print p + 0, f + 0 }' "$log/server.txt")
fuzz_passed=$(grep -c '^fuzz result: passed' "$log/fuzz.txt")
fuzz_failed=$(grep -c '^fuzz result: failed' "$log/fuzz.txt")
load_passed=$(grep -c '^load test result: passed' "$log/server.txt")
load_failed=$(grep -c '^load test result: failed' "$log/server.txt")
soak_passed=$(grep -c '^soak result: passed' "$log/server.txt")
soak_failed=$(grep -c '^soak result: failed' "$log/server.txt")

status=0
[ "$cargo_status" -eq 0 ] || status=1
[ "$fuzz_status" -eq 0 ] || status=1
[ "$server_status" -eq 0 ] || status=1
[ "$vllm_status" -eq 0 ] || status=1
[ "$triton_status" -eq 0 ] || status=1
if [ "$status" -eq 0 ]; then verdict=ok; else verdict=FAILED; fi
echo "tests: $verdict. cargo $cargo_passed passed, $cargo_failed failed (exit $cargo_status);" \
  "fuzz targets $fuzz_passed passed, $fuzz_failed failed (exit $fuzz_status);" \
  "server $py_passed passed, $py_failed failed; load tests $load_passed passed, $load_failed failed;" \
  "soaks $soak_passed passed, $soak_failed failed" \
  "(exit $server_status); vllm plugin $vllm_passed passed, $vllm_failed failed (exit $vllm_status);" \
  "triton $triton_passed passed, $triton_failed failed (exit $triton_status)"
exit "$status"
