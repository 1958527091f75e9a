#!/usr/bin/env bash
# The server tests: exports the tiny fixture and SmolLM2 (small ladder) with the `tlaloc` binary
# in $TLALOC (default target/debug/tlaloc), then, on each test plugin, runs the pytest suite (whose
# fixtures start `tlaloc serve` on free ports and stop it with SIGTERM), the load test at a
# small size and a short soak. Python packages go into .venv-server-tests (pinned in
# requirements.txt).
#
# Environment: TLALOC (binary), TLALOC_TEST_PLUGINS (':'-separated plugin .so paths; default:
# every *.so under .tlaloc/plugins/*/), LOADTEST_CONCURRENCY (default 40), SOAK_SECONDS (default
# 15), PYTHON (default python3).
set -euo pipefail
cd "$(dirname "$0")/../.."

TLALOC=${TLALOC:-target/debug/tlaloc}
PYTHON=${PYTHON:-python3}
work=target/server-tests

if [ ! -x "$TLALOC" ]; then
  echo "no tlaloc binary at $TLALOC; build it with \`cargo build -p tlaloc\` or set TLALOC" >&2
  exit 1
fi
# The model and the plugins: sets `gguf` and `plugins`.
source tests/lane_inputs.sh

venv=.venv-server-tests
if [ ! -x "$venv/bin/python" ]; then
  "$PYTHON" -m venv "$venv"
fi
if ! cmp -s tests/server/requirements.txt "$venv/requirements.installed"; then
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r tests/server/requirements.txt
  cp tests/server/requirements.txt "$venv/requirements.installed"
fi

# An artifact is re-exported when missing or older than the binary (exports are deterministic).
export_artifact() {
  local out=$1; shift
  if [ ! -f "$out/tlaloc-serving.json" ] || [ "$TLALOC" -nt "$out/tlaloc-serving.json" ]; then
    echo "== export $out"
    "$TLALOC" export "$@" --out "$out" --force >/dev/null
  fi
}
mkdir -p "$work"
export_artifact "$work/tiny" --checkpoint tests/data/fixtures/tiny-llama-tied \
  --max-batch 8 --max-context 256 --prefill-chunk 32
export_artifact "$work/smol" --checkpoint "$gguf" \
  --max-batch 2 --max-context 128 --prefill-chunk 64

export TLALOC
export TLALOC_TINY_ARTIFACT="$PWD/$work/tiny"
export TLALOC_SMOL_ARTIFACT="$PWD/$work/smol"
# Every plugin runs every suite even when one fails; the exit status says whether any did.
status=0
# Runs a check and prints "<name> result: passed|failed", the line scripts/test.sh counts.
check() {
  local name=$1
  shift
  if "$@"; then
    echo "$name result: passed"
  else
    echo "$name result: failed"
    status=1
  fi
}
for plugin in "${plugins[@]}"; do
  echo "== server tests on $plugin"
  TLALOC_SERVER_PLUGIN="$plugin" "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/server \
    || status=1
  echo "== load test on $plugin"
  check "load test" "$venv/bin/python" tests/server/loadtest.py --tlaloc "$TLALOC" \
    --plugin "$plugin" --artifact "$TLALOC_TINY_ARTIFACT" --concurrency "${LOADTEST_CONCURRENCY:-40}"
  echo "== soak on $plugin (${SOAK_SECONDS:-15} s; tests/server/soak.py --seconds 600 by hand)"
  check soak "$venv/bin/python" tests/server/soak.py --tlaloc "$TLALOC" --plugin "$plugin" \
    --artifact "$TLALOC_TINY_ARTIFACT" --seconds "${SOAK_SECONDS:-15}"
done
exit "$status"
