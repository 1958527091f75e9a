"""Writes the "CPU" section of docs/benchmarks.md from `tlaloc bench --json` and hf_generate.py.

Usage: cpu_table.py TLALOC_COLD.json TLALOC_WARM.json HF.json META.json docs/benchmarks.md
The section between "## CPU" and the next "## " heading is replaced; the rest of the file is kept.
"""

from __future__ import annotations

import json
import pathlib
import sys

INTRO = """# Benchmarks

Measured speed of Tlaloc next to a peer measured in the same run on the same machine, each as a
ratio to the bytes-per-step floor (SPEC.md section 8): a decode step must read every weight once
plus each row's K/V, so (weight bytes + K/V bytes at the measured context) / memory bandwidth is
the least a step can take. Absolute times from a shared machine mean little on their own.
"""


def section(cold: dict, warm: dict, hf: dict, meta: dict) -> str:
    hf_by_batch = {b["batch"]: b for b in hf["batches"]}
    lines = [
        "## CPU",
        "",
        f"- Command: `{meta['command']}`",
        f"- Date: {meta['date']}; machine: {meta['nproc']} cores, {meta['cpu']}; "
        "**shared with other work while it ran**, so times carry noise.",
        f"- Tlaloc: release build, plugin `{cold['plugin']}` ({cold['platform']}), "
        f"artifact SmolLM2-135M-Instruct f32 ({meta['ladder']}).",
        f"- transformers {hf['transformers']} / torch {hf['torch']} on {hf['torch_threads']} "
        f"threads, `generate` (greedy, dynamic cache, `{hf['attn_implementation']}` attention) "
        "on the same GGUF dequantized to f32.",
        f"- Floor bandwidth: {cold['bandwidth_gbps']:.1f} GB/s ({cold['bandwidth_source']}). "
        f"Weights {cold['weight_bytes'] / 1e6:.1f} MB; K/V {cold['kv_bytes_per_token']} "
        "bytes per token of context.",
        f"- Prompts: {cold['batches'][0]['prompt_len']} random token ids, "
        f"{cold['batches'][0]['gen_len']} generated tokens, end-of-sequence ignored; decode "
        "measured while every row of the batch decodes.",
        "",
        "| measure | Tlaloc | transformers | Tlaloc / floor | Tlaloc / transformers |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for b in cold["batches"]:
        batch = b["batch"]
        d = b["decode"]
        h = hf_by_batch.get(batch)
        ratio_hf = f"{d['wall_ms_per_step'] / h['decode_ms_per_step']:.2f}" if h else "-"
        hf_ms = f"{h['decode_ms_per_step']:.1f}" if h else "-"
        lines.append(
            f"| decode ms/step, batch {batch} (context ~{d['mean_context']}; floor "
            f"{d['floor_ms']:.1f} ms) | {d['wall_ms_per_step']:.1f} | {hf_ms} | "
            f"{d['ratio_to_floor']:.2f} | {ratio_hf} |"
        )
    for b in cold["batches"]:
        if b["batch"] != 1:
            continue
        p = b["prefill"]
        h = hf_by_batch.get(1)
        hf_ms = f"{h['prefill_ms_per_prompt']:.0f}" if h else "-"
        ratio_hf = f"{p['ms_per_prompt'] / h['prefill_ms_per_prompt']:.2f}" if h else "-"
        lines.append(
            f"| prefill of a {b['prompt_len']}-token prompt, ms ({p['steps']} steps) | "
            f"{p['ms_per_prompt']:.0f} | {hf_ms} | - | {ratio_hf} |"
        )
    lines.append(
        f"| start to ready, cold compile cache, ms ({cold['load']['compiled']} entries compiled) | "
        f"{cold['ready_ms']:.0f} | {hf['load_s'] * 1e3:.0f} (load) | - | - |"
    )
    lines.append(
        f"| start to ready, warm compile cache, ms ({warm['load']['cache_hits']} entries from "
        f"the cache) | {warm['ready_ms']:.0f} | | - | - |"
    )
    lines += [
        "",
        "Per decode step, Tlaloc's host-side split (ms: build inputs / upload / execute launch / "
        "wait + readback / other):",
        "",
    ]
    for b in cold["batches"]:
        s = b["decode"]["split_per_step"]
        lines.append(
            f"- batch {b['batch']}: {s['build_ms']:.3f} / {s['upload_ms']:.3f} / "
            f"{s['execute_ms']:.3f} / {s['readback_ms']:.2f} / {s['other_ms']:.3f}"
        )
    by_batch = {b["batch"]: b["decode"]["wall_ms_per_step"] for b in cold["batches"]}
    slower = [b for b in by_batch if b != max(by_batch) and by_batch[b] > by_batch[max(by_batch)]]
    if slower:
        lines += [
            "",
            f"Batch {', '.join(map(str, slower))} decoded slower per step than batch "
            f"{max(by_batch)} in this run: the step time is not set by the bytes read but by how "
            "the plugin's XLA compiled that entry (see the execute / readback split above).",
        ]
    lines += [
        "",
        "A decode step runs on the smallest batch bucket that holds its rows or on the next one "
        "up, whichever the engine measured faster (each is tried for two steps, so the means "
        "above include one first execution of each); with this plugin, one row decodes faster "
        "on the batch-2 entry, whose matmuls XLA compiles as a multithreaded GEMM rather than a "
        "single-threaded matrix-vector loop.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    cold, warm, hf, meta = (json.loads(pathlib.Path(p).read_text()) for p in sys.argv[1:5])
    doc = pathlib.Path(sys.argv[5])
    text = doc.read_text() if doc.exists() else INTRO
    new = section(cold, warm, hf, meta)
    start = text.find("\n## CPU\n")
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + new
    else:
        end = text.find("\n## ", start + 1)
        text = text[: start + 1] + new + (text[end:] if end >= 0 else "")
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)


if __name__ == "__main__":
    main()
