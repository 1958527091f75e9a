"""Prints the GPU lane's results (a directory written by lane.sh) as markdown tables."""
import glob
import json
import os
import sys

lane = sys.argv[1]


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


bw = load(os.path.join(lane, "bandwidth.json")) or {}
print(f"copy bandwidth: {bw.get('bandwidth_bytes_per_s', 0) / 1e12:.2f} TB/s ({bw.get('device', '?')})")
for path in sorted(glob.glob(os.path.join(lane, "agree-*.json"))):
    agree = load(path)
    if agree:
        print(f"{os.path.basename(path)}: " + ", ".join(
            f"prompt {c['prompt_len']}: {c['agree']}/{c['of']}" for c in agree["cases"]))

def hf_rows(shape):
    """transformers' rows: the final RESULT, or the rows it printed as it went (hf-SHAPE.log,
    hf-SHAPE.jsonl) when it was stopped at the lane's time limit."""
    rows = list((load(os.path.join(lane, f"hf-{shape}.json")) or {}).get("speed", []))
    for path in glob.glob(os.path.join(lane, f"hf-{shape}.log")) + glob.glob(
            os.path.join(lane, f"hf-{shape}.jsonl")):
        for line in open(path):
            if line.startswith("{"):
                rows.append(json.loads(line))
    return {(r["batch"], r["context"]): r for r in rows if "error" not in r}


for path in sorted(glob.glob(os.path.join(lane, "bench-*.json"))):
    bench = load(path)
    name = os.path.basename(path)[len("bench-"):-len(".json")]
    shape, variant = name.rsplit("-c", 1)
    context = variant.split("-")[0]
    hf_by_point = hf_rows(shape)
    if not bench:
        print(f"\n{name}: no result")
        continue
    print(f"\n### {name} (ready {bench['ready_ms'] / 1e3:.1f} s, "
          f"compile cache {bench['load'].get('compile_cache')})\n")
    print("| batch | tlaloc ms/step | tokens/s | floor ms | x floor | HF ms/step | HF tokens/s | tlaloc / HF speed | chained steps |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in bench["batches"]:
        d = row["decode"]
        h = hf_by_point.get((row["batch"], int(context)))
        hf_ms = f"{h['decode_ms_per_step']:.2f}" if h else "-"
        hf_tps = f"{h['tokens_per_s']:.0f}" if h else "-"
        ratio = f"{h['decode_ms_per_step'] / d['wall_ms_per_step']:.2f}x" if h else "-"
        print(f"| {row['batch']} | {d['wall_ms_per_step']:.3f} | {d['tokens_per_s']:.0f} | "
              f"{d['floor_ms']:.3f} | {d['ratio_to_floor']:.2f} | {hf_ms} | {hf_tps} | {ratio} | "
              f"{d.get('chained_steps', 0)}/{d['steps']} |")

for path in sorted(glob.glob(os.path.join(lane, "prefill-*.json"))):
    bench = load(path)
    if bench:
        p = bench["batches"][0]["prefill"]
        print(f"{os.path.basename(path)}: prefill {p['tokens']} tokens in {p['ms_per_prompt']:.2f} ms "
              f"(ready {bench['ready_ms'] / 1e3:.2f} s, cache {bench['load'].get('compile_cache')})")
