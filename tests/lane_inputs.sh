# Sourced from the repository root by the Python test lanes (tests/server, tests/vllm,
# tests/triton): checks the real model they export is there and sets `plugins`, the PJRT plugins
# they run on (TLALOC_TEST_PLUGINS, ':'-separated, else every *.so under .tlaloc/plugins/*/).
gguf=.tlaloc/models/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$gguf" ]; then
  echo "the SmolLM2 model is missing at $gguf; run \`bash scripts/setup.sh\`" >&2
  exit 1
fi
if [ -n "${TLALOC_TEST_PLUGINS:-}" ]; then
  IFS=: read -r -a plugins <<< "$TLALOC_TEST_PLUGINS"
else
  shopt -s nullglob
  plugins=(.tlaloc/plugins/*/*.so)
  shopt -u nullglob
fi
if [ ${#plugins[@]} -eq 0 ]; then
  echo "no PJRT plugin found; run \`tlaloc plugin install cpu\` (or bash scripts/setup.sh)" >&2
  exit 1
fi
