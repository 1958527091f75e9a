#!/usr/bin/env bash
# The test command: installs what the tests need (CPU plugins, the real model, the Python client
# used by the server tests) and runs every test of the workspace on both CPU plugins.
set -euo pipefail
cd "$(dirname "$0")/.."
TLALOC_PROFILE=dev bash scripts/setup.sh
cargo test --workspace --quiet
bash tests/server/run.sh
