#!/usr/bin/env bash
# Tlaloc next to llama.cpp on this machine, in one run, at each weight type llama.cpp users run:
# SmolLM2-135M-Instruct as F32, Q8_0 and Q4_1 (the bundled file; the other two converted from it
# by llama.cpp's own `llama-quantize`, so both systems read the same weights). For each type:
#   - llama.cpp: `llama-bench` (prefill of 16 and 128 tokens, decode of 64 tokens at batch 1) and
#     `llama-batched-bench` (128-token prompts, 64 tokens decoded, batch 1 and 8);
#   - Tlaloc: the same GGUF exported with the `cpu` variant (`--keep-quantized` for Q8_0 and Q4_1,
#     so the kernels read the blocks; for those two also with `--quantize-activations`, llama.cpp's
#     integer dots), `tlaloc bench --batch 1,8` after 128- and 16-token prompts.
# Writes OUT/runs.jsonl (one line per measurement) and prints one markdown table.
# Usage: bash scripts/bench/llama_cpp.sh OUT
# Needs `bash scripts/setup.sh` (plugins and the model). The first run builds llama.cpp from the
# `llama-cpp-python` sdist's vendored tree (cmake and ninja from PyPI) into .tlaloc/llama.cpp/,
# about 15 minutes on 2 cores; later runs reuse it. Not part of CI.
# Environment: PLUGIN (default: the lammps CPU plugin), TLALOC (the binary), THREADS (nproc).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:?usage: llama_cpp.sh OUT}
LLAMA_CPP_PYTHON=0.3.36
THREADS=${THREADS:-$(nproc)}
TLALOC=${TLALOC:-target/release/tlaloc}
PLUGIN=${PLUGIN:-$(ls .tlaloc/plugins/lammps-jax-pjrt-cpu-*/*.so 2>/dev/null | head -1)}
GGUF=.tlaloc/models/SmolLM2-135M-Instruct.Q4_1.gguf
HOME_LC=.tlaloc/llama.cpp
BIN=$HOME_LC/build/bin
[ -f "$GGUF" ] || { echo "missing $GGUF: run \`bash scripts/setup.sh\`" >&2; exit 1; }
[ -n "$PLUGIN" ] && [ -f "$PLUGIN" ] || { echo "no CPU plugin: run \`bash scripts/setup.sh\`" >&2; exit 1; }
[ -x "$TLALOC" ] || cargo build --quiet --release -p tlaloc
mkdir -p "$OUT" "$HOME_LC"

if ! [ -x "$BIN/llama-bench" ] || ! [ -x "$BIN/llama-batched-bench" ] || ! [ -x "$BIN/llama-quantize" ]; then
  echo "building llama.cpp from llama-cpp-python==$LLAMA_CPP_PYTHON (once)..." >&2
  python3 -m venv "$HOME_LC/venv"
  "$HOME_LC/venv/bin/pip" install --quiet cmake ninja
  rm -rf "$HOME_LC/sdist" && mkdir -p "$HOME_LC/sdist"
  # The sdist itself, from the package index's simple page (`pip download` would build its
  # metadata, and with it cmake from source), checked against the index's sha256.
  python3 - "$LLAMA_CPP_PYTHON" "$HOME_LC/sdist/llama_cpp_python.tar.gz" <<'PY'
import hashlib, re, sys, urllib.request
version, dest = sys.argv[1], sys.argv[2]
page = urllib.request.urlopen("https://pypi.org/simple/llama-cpp-python/").read().decode()
name = re.escape(f"llama_cpp_python-{version}.tar.gz")
url, sha = re.search(rf'href="([^"#]*{name})#sha256=([0-9a-f]+)"', page).groups()
data = urllib.request.urlopen(url).read()
if hashlib.sha256(data).hexdigest() != sha:
    sys.exit(f"{url}: sha256 differs from the index's {sha}")
open(dest, "wb").write(data)
PY
  tar -xzf "$HOME_LC/sdist/llama_cpp_python.tar.gz" -C "$HOME_LC/sdist"
  src=$(echo "$HOME_LC"/sdist/llama_cpp_python-*/vendor/llama.cpp)
  PATH="$PWD/$HOME_LC/venv/bin:$PATH" cmake -S "$src" -B "$HOME_LC/build" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=ON >/dev/null
  PATH="$PWD/$HOME_LC/venv/bin:$PATH" cmake --build "$HOME_LC/build" -j "$(nproc)" \
    --target llama-bench llama-batched-bench llama-quantize llama-server >/dev/null
fi

: > "$OUT/runs.jsonl"
emit() { # emit JSON-OBJECT: append with the machine's load average
  python3 -c 'import json, sys
d = json.loads(sys.argv[1]); d["load_average"] = float(open("/proc/loadavg").read().split()[0])
print(json.dumps(d))' "$1" >> "$OUT/runs.jsonl"
}

declare -A MODEL=([q4_1]="$GGUF")
for t in F32 Q8_0; do
  lower=${t,,}
  MODEL[$lower]="$OUT/smollm2-$lower.gguf"
  [ -f "${MODEL[$lower]}" ] ||
    "$BIN/llama-quantize" --allow-requantize "$GGUF" "${MODEL[$lower]}" "$t" >/dev/null 2>&1
done

for wtype in f32 q8_0 q4_1; do
  model=${MODEL[$wtype]}
  echo "llama.cpp $wtype..." >&2
  "$BIN/llama-bench" -m "$model" -t "$THREADS" -p 16,128 -n 64 -r 3 -o jsonl 2>/dev/null |
    while read -r line; do
      emit "$(python3 -c 'import json, sys
r = json.loads(sys.argv[1])
kind = "prefill" if r["n_prompt"] else "decode"
tokens = r["n_prompt"] or r["n_gen"]
print(json.dumps({"system": "llama.cpp", "wtype": sys.argv[2], "kind": kind, "batch": 1,
                  "tokens": tokens, "ms": r["avg_ns"] / 1e6 / (1 if kind == "prefill" else tokens),
                  "tool": "llama-bench", "build": r.get("build_commit")}))' "$line" "$wtype")"
    done
  "$BIN/llama-batched-bench" -m "$model" -t "$THREADS" -c 2048 -b 2048 -ub 512 -npp 128 -ntg 64 \
    -npl 1,8 2>/dev/null | python3 -c 'import json, sys
for line in sys.stdin:
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) < 8 or not cells[0].isdigit():
        continue
    pp, tg, b = int(cells[0]), int(cells[1]), int(cells[2])
    t_tg = float(cells[6])
    print(json.dumps({"system": "llama.cpp", "wtype": sys.argv[1], "kind": "decode", "batch": b,
                      "tokens": tg, "prompt": pp, "ms": t_tg * 1e3 / tg, "tool": "llama-batched-bench"}))' "$wtype" |
    while read -r line; do emit "$line"; done

  # Kept blocks are run twice: f32 activations (the blocks widened in the matmul) and activations
  # rounded to 8-bit codes per 32 elements (`--quantize-activations`, integer dots: llama.cpp's
  # arithmetic), recorded as system "tlaloc-xq8".
  variants=(tlaloc)
  [ "$wtype" = f32 ] || variants+=(tlaloc-xq8)
  for system in "${variants[@]}"; do
    echo "$system $wtype..." >&2
    keep=()
    [ "$wtype" = f32 ] || keep=(--keep-quantized)
    [ "$system" = tlaloc-xq8 ] && keep+=(--quantize-activations)
    artifact="$OUT/$system-$wtype"
    "$TLALOC" export --checkpoint "$model" --out "$artifact" --dtype f32 "${keep[@]}" \
      --max-batch 8 --max-context 256 --prefill-chunk 16,128 --variants cpu --force >/dev/null
    for prompt in 128 16; do
      "$TLALOC" bench --artifact "$artifact" --plugin "$PLUGIN" --batch 1,8 --prompt-len "$prompt" \
        --gen-len 64 --compile-cache "$OUT/compile-cache" --json 2>/dev/null |
        python3 -c 'import json, sys
d = json.load(sys.stdin)
for b in d["batches"]:
    print(json.dumps({"system": sys.argv[3], "wtype": sys.argv[1], "kind": "decode", "batch": b["batch"],
                      "tokens": 64, "prompt": int(sys.argv[2]), "ms": b["decode"]["wall_ms_per_step"],
                      "floor_ms": b["decode"]["floor_ms"], "tool": "tlaloc bench"}))
    if b["batch"] == 1:
        print(json.dumps({"system": sys.argv[3], "wtype": sys.argv[1], "kind": "prefill", "batch": 1,
                          "tokens": int(sys.argv[2]), "ms": b["prefill"]["ms_per_prompt"], "tool": "tlaloc bench"}))' \
          "$wtype" "$prompt" "$system" | while read -r line; do emit "$line"; done
    done
  done
done

python3 - "$OUT/runs.jsonl" <<'PY'
import collections, json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
cell = collections.defaultdict(list)
for r in runs:
    cell[(r["system"], r["wtype"], r["kind"], r["batch"], r["tokens"] if r["kind"] == "prefill" else 0)].append(r["ms"])
def ms(*key):
    v = cell.get(key)
    return statistics.median(v) if v else None
def fmt(v):
    return "—" if v is None else f"{v:.1f}"
def ratio(a, b):
    return "—" if a is None or b is None else f"{a / b:.2f}x"
print("| weights | decode ms/token b1: tlaloc | llama.cpp | ratio | b8 ms/step: tlaloc | llama.cpp | ratio | prefill 16 ms: tlaloc | llama.cpp | prefill 128 ms: tlaloc | llama.cpp | ratio |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
rows = [("f32", "tlaloc"), ("q8_0", "tlaloc"), ("q8_0", "tlaloc-xq8"), ("q4_1", "tlaloc"), ("q4_1", "tlaloc-xq8")]
for w, system in rows:
    t1, l1 = ms(system, w, "decode", 1, 0), ms("llama.cpp", w, "decode", 1, 0)
    t8, l8 = ms(system, w, "decode", 8, 0), ms("llama.cpp", w, "decode", 8, 0)
    p16 = ms(system, w, "prefill", 1, 16), ms("llama.cpp", w, "prefill", 1, 16)
    p128 = ms(system, w, "prefill", 1, 128), ms("llama.cpp", w, "prefill", 1, 128)
    label = w if system == "tlaloc" else f"{w}, activations q8"
    print(f"| {label} | {fmt(t1)} | {fmt(l1)} | {ratio(t1, l1)} | {fmt(t8)} | {fmt(l8)} | {ratio(t8, l8)} | "
          f"{fmt(p16[0])} | {fmt(p16[1])} | {fmt(p128[0])} | {fmt(p128[1])} | {ratio(p128[0], p128[1])} |")
print("\nratio: tlaloc / llama.cpp time (under 1: tlaloc faster); \"activations q8\": exported with "
      "--quantize-activations. llama.cpp's batch-1 decode is the "
      "median of llama-bench (empty context) and llama-batched-bench (after 128 tokens).")
PY
