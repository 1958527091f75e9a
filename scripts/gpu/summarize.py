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


PEERS = ("jax", "torch")


def peer_rows(peer, shape):
    """A peer's rows (peer_jax.py / peer_torch.py RESULT lines, one JSON object a line, in
    PEER-SHAPE.json), by (batch, context); rows that report an error are left out."""
    rows = {}
    try:
        lines = open(os.path.join(lane, f"{peer}-{shape}.json")).read().splitlines()
    except OSError:
        return rows
    for line in lines:
        if line.strip():
            r = json.loads(line)
            if "error" not in r:
                rows[(r["batch"], r["context"])] = r
    return rows


def peer_cells(peers, point, tlaloc_ms):
    """JAX, JAX loop and torch ms/step, and Tlaloc's ms/step over the fastest of them (below 1:
    Tlaloc is faster), naming that peer."""
    jax, torch = peers["jax"].get(point), peers["torch"].get(point)
    times = {"JAX": jax and jax.get("decode_ms_per_step"),
             "JAX loop": jax and jax.get("loop_ms_per_step"),
             "torch": torch and torch.get("decode_ms_per_step")}
    cells = [f"{t:.3f}" if t else "-" for t in times.values()]
    measured = {name: t for name, t in times.items() if t}
    if measured:
        best = min(measured, key=measured.get)
        cells.append(f"{tlaloc_ms / measured[best]:.2f} ({best})")
    else:
        cells.append("-")
    return " " + " | ".join(cells) + " |"


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
    peers = {peer: peer_rows(peer, shape) for peer in PEERS}
    has_peers = any(os.path.exists(os.path.join(lane, f"{peer}-{shape}.json")) for peer in PEERS)
    peer_header = " JAX ms/step | JAX loop ms/step | torch ms/step | Tlaloc / best peer |"
    print("| batch | tlaloc ms/step | tokens/s | floor ms | x floor | HF ms/step | HF tokens/s | tlaloc / HF speed | chained steps |"
          + (peer_header if has_peers else ""))
    print("|---|---|---|---|---|---|---|---|---|" + ("---|" * 4 if has_peers else ""))
    for row in bench["batches"]:
        d = row["decode"]
        h = hf_by_point.get((row["batch"], int(context)))
        hf_ms = f"{h['decode_ms_per_step']:.2f}" if h else "-"
        hf_tps = f"{h['tokens_per_s']:.0f}" if h else "-"
        ratio = f"{h['decode_ms_per_step'] / d['wall_ms_per_step']:.2f}x" if h else "-"
        print(f"| {row['batch']} | {d['wall_ms_per_step']:.3f} | {d['tokens_per_s']:.0f} | "
              f"{d['floor_ms']:.3f} | {d['ratio_to_floor']:.2f} | {hf_ms} | {hf_tps} | {ratio} | "
              f"{d.get('chained_steps', 0)}/{d['steps']} |" + (peer_cells(
                  peers, (row["batch"], int(context)), d["wall_ms_per_step"]) if has_peers else ""))

for peer in PEERS:
    for path in sorted(glob.glob(os.path.join(lane, f"{peer}-*.json"))):
        rows = [json.loads(line) for line in open(path) if line.strip()]
        check = next((r["check"] for r in rows if "check" in r), None)
        if check:
            print(f"{os.path.basename(path)}: self-check against transformers "
                  f"{check['agreed_steps']}/{check['of']} steps, "
                  f"max logit error {check['max_logit_err']:.3g} "
                  f"(tolerance {check['tol']:.3g}); {sum('error' not in r for r in rows)} points")
        else:
            print(f"{os.path.basename(path)}: no result (see {peer}-*.log)")

for path in sorted(glob.glob(os.path.join(lane, "prefill-*.json"))):
    bench = load(path)
    if bench:
        p = bench["batches"][0]["prefill"]
        print(f"{os.path.basename(path)}: prefill {p['tokens']} tokens in {p['ms_per_prompt']:.2f} ms "
              f"(ready {bench['ready_ms'] / 1e3:.2f} s, cache {bench['load'].get('compile_cache')})")
