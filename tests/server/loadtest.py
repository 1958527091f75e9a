"""Load test: many concurrent streaming completions against `tlaloc serve`.

Every request asks for exactly --max-tokens tokens (`ignore_eos`). Fails (exit 1) on any 5xx or
transport error, on an accepted request that does not end with that many tokens and
finish_reason "length", or on K/V pages still held once everything is done. 429s are counted,
not failures. Prints p50/p99 time to first token and inter-token latency.

    python tests/server/loadtest.py --url http://127.0.0.1:8000 --concurrency 200
    python tests/server/loadtest.py --tlaloc target/release/tlaloc --plugin cpu \
        --artifact target/server-tests/tiny --concurrency 200
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


async def one(client: httpx.AsyncClient, url: str, model: str, i: int, max_tokens: int) -> dict:
    body = {"model": model, "prompt": f"Request {i}: tell me a story about the number {i}.",
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


async def run(url: str, model: str, concurrency: int, max_tokens: int) -> list[dict]:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:
        return await asyncio.gather(*(one(client, url, model, i, max_tokens)
                                      for i in range(concurrency)))


def idle_metrics(url: str, timeout: float = 30.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        text = httpx.get(f"{url}/metrics", timeout=10).text
        m = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                m[name] = float(value)
        if (m["tlaloc:kv_cache_pages_used"] == 0 and m["tlaloc:num_requests_running"] == 0) \
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
    args = ap.parse_args()

    server = None
    if args.url:
        url = args.url
    else:
        if not (args.tlaloc and args.plugin and args.artifact):
            ap.error("give --url, or --tlaloc, --plugin and --artifact")
        server = Server(args.artifact, args.model, binary=args.tlaloc, plugin=args.plugin)
        url = server.url
    failures = []
    try:
        started = time.perf_counter()
        results = asyncio.run(run(url, args.model, args.concurrency, args.max_tokens))
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
    if metrics["tlaloc:kv_cache_pages_used"] != 0:
        failures.append(f"{metrics['tlaloc:kv_cache_pages_used']:.0f} K/V pages still held")

    ttft = [r["ttft"] for r in accepted if r["ttft"] is not None]
    itl = [x for r in accepted for x in r["itl"]]
    tokens = sum(r["tokens"] or 0 for r in accepted)
    print(f"load test: {args.concurrency} concurrent streaming requests x {args.max_tokens} tokens"
          f" on {platform.machine()} ({platform.node()})")
    print(f"  accepted {len(accepted)}, rejected 429 {len(rejected)}, failures {len(failures)}")
    print(f"  wall {wall:.2f} s, {tokens / wall:.1f} generated tokens/s")
    print(f"  TTFT p50 {percentile(ttft, 50) * 1e3:.1f} ms, p99 {percentile(ttft, 99) * 1e3:.1f} ms")
    print(f"  ITL  p50 {percentile(itl, 50) * 1e3:.1f} ms, p99 {percentile(itl, 99) * 1e3:.1f} ms")
    print(f"  K/V pages in use afterwards: {metrics['tlaloc:kv_cache_pages_used']:.0f}")
    for f in failures[:20]:
        print(f"  FAIL {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
