"""Summary of scripts/gpu/profile_batch.sh's Nsight Compute tables: per batch, Tlaloc's and the
plain JAX step's kernels per decode step and GPU time per step, then both grouped by kernel kind
(the kernel name with its numbers dropped, e.g. `loop_add_fusion_12` -> `loop_add_fusion`), side
by side, largest difference first.

A table holds STEPS or more decode steps plus whatever else ran under the profiler (start-up
copies). XLA names each kernel of a program uniquely, but a layer's kernels repeat once per layer
under one name, so a name runs once per step (the embedding, the final norm, the LM head, the
argmax) or once per layer per step; the number of steps taken is the smallest count that at least
three names share, and every figure is divided by it.
  python3 scripts/gpu/summarize_profile.py OUT_DIR STEPS BATCH...
"""
import collections
import csv
import re
import sys

SCALE = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}


def kernels(path):
    rows = [r for r in csv.reader(open(path, errors="replace")) if len(r) > 10]
    if not rows:
        return []
    head = rows[0]
    ki, vi, ui = head.index("Kernel Name"), head.index("Metric Value"), head.index("Metric Unit")
    return [(r[ki], float(r[vi].replace(",", "")) * SCALE[r[ui]]) for r in rows[1:]]


def kind(name):
    base = name.split("(")[0].split("<")[0]
    return re.sub(r"(_\d+)+$", "", re.sub(r"\d+", "N", base) if "fusion" not in base else base)


def per_step(table):
    count = collections.Counter(name for name, _ in table)
    shared = collections.Counter(count.values())
    steps = min(c for c, names in shared.items() if names >= 3)
    total, n = collections.Counter(), collections.Counter()
    for name, us in table:
        total[kind(name)] += us
        n[kind(name)] += 1
    return steps, {k: (total[k] / steps / 1e3, n[k] / steps) for k in total}


def main():
    out, _, batches = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    for b in batches:
        sides = {}
        for side in ("tlaloc", "jax"):
            table = kernels(f"{out}/ncu-{side}-b{b}.csv")
            if table:
                sides[side] = per_step(table)
        print(f"== batch {b}, context bucket 512")
        for side, (steps, kinds) in sides.items():
            ms = sum(v[0] for v in kinds.values())
            n = sum(v[1] for v in kinds.values())
            print(f"{side:>7}: {n:.0f} kernels, {ms:.3f} ms of GPU time per step ({steps} steps)")
        if len(sides) < 2:
            continue
        t, j = sides["tlaloc"][1], sides["jax"][1]
        rows = sorted(set(t) | set(j), key=lambda k: -abs(t.get(k, (0, 0))[0] - j.get(k, (0, 0))[0]))
        print(f"{'kernel kind':<60} {'tlaloc ms':>9} {'n':>5} {'jax ms':>9} {'n':>5}")
        for k in rows[:30]:
            tm, tn = t.get(k, (0.0, 0.0))
            jm, jn = j.get(k, (0.0, 0.0))
            print(f"{k[:60]:<60} {tm:9.4f} {tn:5.0f} {jm:9.4f} {jn:5.0f}")


if __name__ == "__main__":
    main()
