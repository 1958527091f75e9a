"""The per-token cost of a JSON-schema constraint as a client sees it: the mean time between
streamed tokens of greedy chat replies on one server, unconstrained (decode chains on) and
constrained by a schema (mask per token, logits read back, no chain), same prompts.

    python tests/server/bench_structured.py --tlaloc target/release/tlaloc \
        --plugin PLUGIN.so --artifact ARTIFACT [--rounds 3]
"""

import argparse
import statistics
import time

import openai

from serverctl import Server
from test_structured import PERSON, PROMPTS


def inter_token_ms(client, prompt, **kw):
    stream = client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": prompt}], max_tokens=40,
        temperature=0, stream=True, **kw)
    stamps = []
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            stamps.append(time.perf_counter())
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    return gaps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tlaloc", required=True)
    ap.add_argument("--plugin", required=True)
    ap.add_argument("--artifact", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    server = Server(args.artifact, "smol", binary=args.tlaloc, plugin=args.plugin)
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}
        inter_token_ms(client, PROMPTS[0], response_format=fmt)  # compile once, warm up
        free, constrained = [], []
        for _ in range(args.rounds):
            for p in PROMPTS:
                free += inter_token_ms(client, p, extra_body={"ignore_eos": True})
                constrained += inter_token_ms(client, p, response_format=fmt)
        for name, gaps in [("unconstrained", free), ("json_schema", constrained)]:
            print(f"{name}: {len(gaps)} gaps, mean {1e3 * statistics.mean(gaps):.1f} ms, "
                  f"median {1e3 * statistics.median(gaps):.1f} ms")
        print(f"ratio json_schema / unconstrained (median): "
              f"{statistics.median(constrained) / statistics.median(free):.2f}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
