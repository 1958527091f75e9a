#!/usr/bin/env bash
# Bounded runs of every cargo-fuzz target in fuzz/ (FUZZ_SECONDS each, default 20), each
# seeded from fuzz/seeds/<target> where there is one; new inputs go to fuzz/target/corpus.
# cargo-fuzz needs a nightly toolchain: without one this says so and exits 0, because the
# stable suite (`cargo test`) runs the same harnesses over the seeds and seeded mutations.
# cargo-fuzz itself is installed once into .tlaloc/tools.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-20}
if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "fuzz: no nightly toolchain here; the harnesses ran only as stable tests"
  exit 0
fi
tools="$PWD/.tlaloc/tools"
if [ ! -x "$tools/bin/cargo-fuzz" ]; then
  echo "== installing cargo-fuzz 0.13.2 into .tlaloc/tools"
  cargo install --quiet --locked --root "$tools" cargo-fuzz@0.13.2
fi
export PATH="$tools/bin:$PATH"
cd fuzz
echo "== building the fuzz targets"
cargo +nightly fuzz build -O
for target in $(cargo +nightly fuzz list); do
  corpus="target/corpus/$target"
  mkdir -p "$corpus"
  seeds=()
  [ -d "seeds/$target" ] && seeds=("seeds/$target")
  echo "== fuzz $target for ${seconds}s"
  rm -rf "artifacts/$target"
  log="target/fuzz-$target.log"
  if cargo +nightly fuzz run -O "$target" "$corpus" "${seeds[@]}" -- \
    -max_total_time="$seconds" -print_final_stats=1 >"$log" 2>&1; then
    runs=$(grep -m1 '^stat::number_of_executed_units' "$log" | awk '{print $2}')
    echo "fuzz result: passed ($target, ${runs:-?} inputs)"
  else
    tail -n 40 "$log"
    echo "fuzz result: failed ($target; the input is under fuzz/artifacts/$target/)"
    exit 1
  fi
done
