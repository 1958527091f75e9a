"""Load test: many concurrent streaming completions against `tlaloc serve` (or any server with
tlaloc's or vLLM's /metrics and /tokenize, given by --url).

Every request asks for exactly --max-tokens tokens (`ignore_eos`). Fails (exit 1) on any 5xx or
transport error, on an accepted request that does not end with that many tokens and
finish_reason "length", or on K/V pages still held once everything is done. 429s are counted,
not failures. Prints p50/p99 time to first token and inter-token latency.

With --system-prompt-tokens N every prompt starts with the same N tokens (a system prompt, as
token ids, from the server's own tokenizer), as a chat service's requests do; --serve-arg passes
flags to the server it starts (e.g. --serve-arg=--no-prefix-cache).

    python tests/server/loadtest.py --url http://127.0.0.1:8000 --concurrency 200
    python tests/server/loadtest.py --tlaloc target/release/tlaloc --plugin cpu \
        --artifact target/server-tests/tiny --concurrency 200
    python tests/server/loadtest.py --tlaloc target/release/tlaloc --plugin cpu \
        --artifact DIR --concurrency 64 --system-prompt-tokens 200
"""

import argparse
import asyncio
import json
import platform
import sys
import time

import httpx

from serverctl import Server


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


SYSTEM_TEXT = ("You are a helpful assistant for a small public library. Answer questions about "
               "opening hours, borrowing rules, events and the catalogue politely and briefly. "
               "When you do not know, say so and suggest asking the front desk. ")


def request_text(i: int) -> str:
    return f"Request {i}: tell me a story about the number {i}."


def tokenize(url: str, text: str) -> list[int]:
    r = httpx.post(f"{url}/tokenize", json={"prompt": text, "add_special_tokens": False},
                   timeout=30)
    r.raise_for_status()
    return r.json()["tokens"]


def system_prompt_ids(url: str, n: int) -> list[int]:
    """The first n tokens of the system text repeated (the same for every request)."""
    text = SYSTEM_TEXT
    while len(ids := tokenize(url, text)) < n:
        text += SYSTEM_TEXT
    return ids[:n]


async def one(client: httpx.AsyncClient, url: str, model: str, i: int, max_tokens: int,
              prompt) -> dict:
    body = {"model": model, "prompt": prompt,
            "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    result = {"status": None, "ttft": None, "itl": [], "tokens": None, "finish": None,
              "error": None}
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
            result["status"] = r.status_code
            if r.status_code != 200:
                await r.aread()
                return result
            last = None
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: "):]
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    result["error"] = chunk["error"]["message"]
                    break
                now = time.perf_counter()
                for choice in chunk["choices"]:
                    if choice.get("text"):
                        if last is None:
                            result["ttft"] = now - start
                        else:
                            result["itl"].append(now - last)
                        last = now
                    if choice.get("finish_reason"):
                        result["finish"] = choice["finish_reason"]
                if chunk.get("usage"):
                    result["tokens"] = chunk["usage"]["completion_tokens"]
    except httpx.HTTPError as e:
        result["error"] = f"{type(e).__name__}: {e}"
    return result


async def run(url: str, model: str, concurrency: int, max_tokens: int,
              prompts: list) -> list[dict]:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:
        return await asyncio.gather(*(one(client, url, model, i, max_tokens, prompts[i])
                                      for i in range(concurrency)))


# What the idle check reads, by server: tlaloc's own metrics, or vLLM's (`vllm serve` running an
# artifact through the vllm-tlaloc plugin, for the comparison in scripts/bench_vllm_serve.sh).
PAGES_IN_USE = ("tlaloc:kv_cache_pages_used", "vllm:kv_cache_usage_perc")
RUNNING = ("tlaloc:num_requests_running", "vllm:num_requests_running")


def read_metrics(url: str) -> dict[str, float]:
    """The server's Prometheus metrics, each summed over its label sets."""
    m: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            name = name.split("{", 1)[0]
            m[name] = m.get(name, 0.0) + float(value)
    return m


def first_of(m: dict[str, float], names: tuple[str, ...]) -> float:
    for name in names:
        if name in m:
            return m[name]
    raise KeyError(f"the server's /metrics has none of {', '.join(names)}")


def idle_metrics(url: str, timeout: float = 30.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        m = read_metrics(url)
        if (first_of(m, PAGES_IN_USE) == 0 and first_of(m, RUNNING) == 0) \
                or time.monotonic() > deadline:
            return m
        time.sleep(0.1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--url", help="a running server (else one is started from --artifact)")
    ap.add_argument("--tlaloc", help="the tlaloc binary (when starting a server)")
    ap.add_argument("--plugin", help="the plugin (when starting a server)")
    ap.add_argument("--artifact", help="the artifact to serve (when starting a server)")
    ap.add_argument("--model", default="loadtest")
    ap.add_argument("--concurrency", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--system-prompt-tokens", type=int, default=0,
                    help="tokens of a system prompt shared by every request (0: none)")
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="a flag for the server started (repeatable)")
    args = ap.parse_args()

    server = None
    if args.url:
        url = args.url
    else:
        if not (args.tlaloc and args.plugin and args.artifact):
            ap.error("give --url, or --tlaloc, --plugin and --artifact")
        server = Server(args.artifact, args.model, *args.serve_arg, binary=args.tlaloc,
                        plugin=args.plugin)
        url = server.url
    failures = []
    try:
        if args.system_prompt_tokens:
            system = system_prompt_ids(url, args.system_prompt_tokens)
            prompts = [system + tokenize(url, request_text(i)) for i in range(args.concurrency)]
        else:
            prompts = [request_text(i) for i in range(args.concurrency)]
        before = idle_metrics(url)
        started = time.perf_counter()
        results = asyncio.run(run(url, args.model, args.concurrency, args.max_tokens, prompts))
        wall = time.perf_counter() - started
        metrics = idle_metrics(url)
    finally:
        if server is not None:
            rc = server.stop()
            if rc != 0:
                failures.append(f"the server exited with {rc}")

    accepted = [r for r in results if r["status"] == 200]
    rejected = [r for r in results if r["status"] == 429]
    for i, r in enumerate(results):
        if r["error"] or r["status"] is None or r["status"] >= 500:
            failures.append(f"request {i}: status {r['status']}, {r['error']}")
        elif r["status"] == 200 and (r["tokens"] != args.max_tokens or r["finish"] != "length"):
            failures.append(f"request {i}: {r['tokens']} tokens, finish {r['finish']}")
        elif r["status"] not in (200, 429):
            failures.append(f"request {i}: unexpected status {r['status']}")
    pages_in_use = first_of(metrics, PAGES_IN_USE)
    if pages_in_use != 0:
        failures.append(f"K/V cache still in use afterwards ({pages_in_use:g})")

    ttft = [r["ttft"] for r in accepted if r["ttft"] is not None]
    itl = [x for r in accepted for x in r["itl"]]
    tokens = sum(r["tokens"] or 0 for r in accepted)
    print(f"load test: {args.concurrency} concurrent streaming requests x {args.max_tokens} tokens"
          f" on {platform.machine()} ({platform.node()})")
    print(f"  accepted {len(accepted)}, rejected 429 {len(rejected)}, failures {len(failures)}")
    print(f"  wall {wall:.2f} s, {tokens / wall:.1f} generated tokens/s")
    print(f"  TTFT p50 {percentile(ttft, 50) * 1e3:.1f} ms, p99 {percentile(ttft, 99) * 1e3:.1f} ms")
    print(f"  ITL  p50 {percentile(itl, 50) * 1e3:.1f} ms, p99 {percentile(itl, 99) * 1e3:.1f} ms")
    print(f"  K/V pages in use afterwards: {pages_in_use:g}")
    delta = {k: metrics.get(k, 0.0) - before.get(k, 0.0) for k in (
        "tlaloc:prefix_cache_lookups_total", "tlaloc:prefix_cache_lookup_hits_total",
        "tlaloc:prefix_cache_queries_total", "tlaloc:prefix_cache_hits_total")}
    print(f"  system prompt {args.system_prompt_tokens} tokens; prefix cache: "
          f"{delta['tlaloc:prefix_cache_lookup_hits_total']:.0f} of "
          f"{delta['tlaloc:prefix_cache_lookups_total']:.0f} lookups hit, "
          f"{delta['tlaloc:prefix_cache_hits_total']:.0f} of "
          f"{delta['tlaloc:prefix_cache_queries_total']:.0f} prompt tokens cached")
    for f in failures[:20]:
        print(f"  FAIL {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
