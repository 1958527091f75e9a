#!/usr/bin/env bash
# The Triton backend tests: fetches the real tritonserver (nvidia-pytriton's wheel, downloaded
# once into .tlaloc/triton/ with `pip download --no-deps` and unpacked there), builds the backend
# (libtriton_tlaloc.so) and the `tlaloc` binary, exports SmolLM2 (decode batch 4, context 128),
# then on each test plugin runs the pytest suite, whose fixture starts tritonserver on random
# loopback ports and stops it by PID with SIGTERM. Python packages go into .venv-triton-tests
# (pinned in requirements.txt).
#
# Environment: TLALOC_PROFILE (cargo profile of the builds; default dev), TLALOC_TEST_PLUGINS
# (':'-separated plugin .so paths; default: every *.so under .tlaloc/plugins/*/), PYTHON
# (default python3).
set -euo pipefail
cd "$(dirname "$0")/../.."

PYTHON=${PYTHON:-python3}
profile=${TLALOC_PROFILE:-dev}
case "$profile" in dev) out_dir=debug ;; *) out_dir=$profile ;; esac
pytriton=nvidia-pytriton==0.7.0
cache=.tlaloc/triton
work=target/triton-tests

# The model and the plugins: sets `gguf` and `plugins`.
source tests/lane_inputs.sh

# The server: the wheel's own tritonserver binary and libraries (it needs glibc 2.35+; on an
# older machine it fails to start, and so does this script).
server=$cache/server/pytriton/tritonserver/bin/tritonserver
if [ ! -x "$server" ]; then
  mkdir -p "$cache/wheel"
  if ! ls "$cache"/wheel/nvidia_pytriton-0.7.0-*.whl >/dev/null 2>&1; then
    "$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps "$pytriton" -d "$cache/wheel"
  fi
  rm -rf "$cache/server.partial"
  "$PYTHON" -m zipfile -e "$cache"/wheel/nvidia_pytriton-0.7.0-*.whl "$cache/server.partial"
  chmod +x "$cache/server.partial/pytriton/tritonserver/bin/tritonserver"
  mv "$cache/server.partial" "$cache/server"
fi
# `--help` exits 1 after printing its usage; a binary that cannot start prints no usage.
usage=$("$server" --help 2>&1 || true)
if [[ "$usage" != *"Usage: tritonserver"* ]]; then
  echo "the wheel's tritonserver does not run on this machine (it needs glibc 2.35+):" >&2
  printf '%s\n' "$usage" | head -5 >&2
  exit 1
fi

venv=.venv-triton-tests
if [ ! -x "$venv/bin/python" ]; then
  "$PYTHON" -m venv "$venv"
fi
if ! cmp -s tests/triton/requirements.txt "$venv/requirements.installed"; then
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r tests/triton/requirements.txt
  cp tests/triton/requirements.txt "$venv/requirements.installed"
fi

cargo build --quiet --profile "$profile" -p tlaloc -p tlaloc-triton
tlaloc=target/$out_dir/tlaloc
backend=target/$out_dir/libtriton_tlaloc.so
if readelf -d "$backend" | grep -q 'NEEDED.*libtritonserver'; then
  echo "$backend names libtritonserver as a dependency; it must resolve the server's symbols at load" >&2
  exit 1
fi

mkdir -p "$work"
artifact=$work/smol
if [ ! -f "$artifact/tlaloc-serving.json" ] || [ "$tlaloc" -nt "$artifact/tlaloc-serving.json" ]; then
  echo "== export $artifact"
  "$tlaloc" export --checkpoint "$gguf" --max-batch 4 --max-context 128 --prefill-chunk 64 \
    --out "$artifact" --force >/dev/null
fi

export TLALOC_TRITONSERVER="$PWD/$server"
export TLALOC_TRITON_BACKEND="$PWD/$backend"
export TLALOC_TRITON_ARTIFACT="$PWD/$artifact"
export TLALOC_TRITON_COMPILE_CACHE="$PWD/$work/compile-cache"
status=0
for plugin in "${plugins[@]}"; do
  echo "== triton tests on $plugin"
  TLALOC_TRITON_PLUGIN="$(realpath "$plugin")" "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/triton \
    || status=1
done
exit "$status"
