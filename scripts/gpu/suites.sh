#!/usr/bin/env bash
# Runs prebuilt test binaries (`cargo test --release --no-run`, copied into DIR as test-NAME)
# against the CUDA PJRT plugin that discovery finds on this machine, and writes one summary
# per suite into OUT_DIR.
#   bash scripts/gpu/suites.sh DIR OUT_DIR [extra libtest args, e.g. --skip smollm2]
# The layout test is skipped: it compiles against the CPU wheel's C header, which is not here.
set -uo pipefail
cd "$(dirname "$0")/../.."
dir=${1:?usage: suites.sh DIR OUT_DIR [ARGS...]}
out=$(realpath -m "${2:?usage: suites.sh DIR OUT_DIR [ARGS...]}")
shift 2
mkdir -p "$out"
plugin=$(python3 - <<'PY'
import glob, os, site
paths = site.getsitepackages() + [site.getusersitepackages()]
hits = [p for s in paths for p in glob.glob(os.path.join(s, "jax_plugins/*cuda*/xla_cuda_plugin.so"))]
print(hits[0] if hits else "")
PY
)
[ -n "$plugin" ] || { echo "no CUDA PJRT plugin in this python's site-packages" >&2; exit 1; }
export TLALOC_TEST_PLUGINS=$plugin
echo "plugin: $plugin" | tee "$out/suites.txt"
status=0
for bin in "$dir"/test-*; do
  name=${bin##*/test-}
  "$bin" --skip layout "$@" > "$out/suite-$name.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || status=1
  echo "$name: exit $rc, $(grep -E '^test result' "$out/suite-$name.log" | tail -1)" | tee -a "$out/suites.txt"
  grep -E '^test .* FAILED' "$out/suite-$name.log" | tee -a "$out/suites.txt"
done
exit $status
