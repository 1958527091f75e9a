#!/usr/bin/env bash
# The main job on a fresh machine: set up, then check every installed plugin end to end.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
TLALOC=target/release/tlaloc
"$TLALOC" plugin list
for plugin in .tlaloc/plugins/*/*.so; do
  "$TLALOC" plugin check "$plugin"
done
