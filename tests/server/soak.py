"""Soak: a mixed load against `tlaloc serve` for a bounded time, on loopback only.

Workers send, back to back, plain and streaming completions and chat completions (some with
`n=2`, some sampled with a seed, some with logprobs), and disconnect on purpose from one request
in ten mid-stream. Fails (exit 1) on any 5xx or transport error on a request that was not
dropped on purpose, on K/V pages still held once the server is idle, and, for runs of at least
`--memory-after` seconds, on memory that keeps growing: the server's resident size is sampled
every second, and the growth over the second half of the run must stay under `--max-growth`
of the resident size at the half-way point (a leak grows with the request count, so it shows
over the second half; start-up allocations do not).

    python tests/server/soak.py --tlaloc target/release/tlaloc --plugin cpu \
        --artifact target/server-tests/tiny --seconds 600
"""

import argparse
import asyncio
import json
import random
import sys
import time

import httpx

from serverctl import Server


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def request_for(rng: random.Random, i: int) -> tuple[str, dict]:
    """One request of the mix: endpoint and body."""
    common = {"max_tokens": rng.choice([4, 16, 48]), "ignore_eos": rng.random() < 0.5}
    if rng.random() < 0.3:
        common.update(temperature=0.8, seed=i)
    else:
        common.update(temperature=0)
    if rng.random() < 0.2:
        common["n"] = 2
    stream = rng.random() < 0.6
    if stream:
        common.update(stream=True, stream_options={"include_usage": True})
    if rng.random() < 0.5:
        if not stream and rng.random() < 0.3:
            common["logprobs"] = 2
        return "/v1/completions", {"prompt": f"Story {i}: once upon a time", **common}
    messages = [{"role": "user", "content": f"Say something about {i}."}]
    return "/v1/chat/completions", {"messages": messages, **common}


async def worker(client: httpx.AsyncClient, url: str, seed: int, deadline: float,
                 tally: dict) -> None:
    rng = random.Random(seed)
    i = 0
    while time.monotonic() < deadline:
        i += 1
        path, body = request_for(rng, seed * 100_000 + i)
        drop = body.get("stream") and rng.random() < 0.1
        tally["requests"] += 1
        try:
            if body.get("stream"):
                async with client.stream("POST", f"{url}{path}", json=body) as r:
                    tally[r.status_code] = tally.get(r.status_code, 0) + 1
                    if r.status_code != 200:
                        await r.aread()
                        continue
                    seen = 0
                    async for line in r.aiter_lines():
                        if line.startswith("data: "):
                            seen += 1
                            data = line[len("data: "):]
                            if data != "[DONE]" and "error" in json.loads(data):
                                tally["stream_errors"] += 1
                        if drop and seen == 2:
                            tally["dropped"] += 1
                            break
            else:
                r = await client.post(f"{url}{path}", json=body)
                tally[r.status_code] = tally.get(r.status_code, 0) + 1
        except httpx.HTTPError as e:
            tally["transport_errors"] += 1
            tally.setdefault("first_error", f"{type(e).__name__}: {e}")


async def soak(url: str, workers: int, seconds: float) -> dict:
    tally = {"requests": 0, "dropped": 0, "stream_errors": 0, "transport_errors": 0}
    deadline = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=workers, max_keepalive_connections=workers)
    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0), limits=limits) as client:
        await asyncio.gather(*(worker(client, url, s, deadline, tally) for s in range(workers)))
    return tally


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tlaloc", required=True)
    ap.add_argument("--plugin", required=True)
    ap.add_argument("--artifact", required=True)
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--memory-after", type=float, default=120,
                    help="check memory only for runs at least this long")
    ap.add_argument("--max-growth", type=float, default=0.10)
    args = ap.parse_args()

    server = Server(args.artifact, "soak", "--max-queue", "64", binary=args.tlaloc,
                    plugin=args.plugin)
    samples: list[tuple[float, int]] = []
    failures = []
    try:
        async def sampled() -> dict:
            async def sample() -> None:
                start = time.monotonic()
                while True:
                    samples.append((time.monotonic() - start, rss_bytes(server.proc.pid)))
                    await asyncio.sleep(1.0)
            sampler = asyncio.create_task(sample())
            try:
                return await soak(server.url, args.workers, args.seconds)
            finally:
                sampler.cancel()

        tally = asyncio.run(sampled())
        idle = server.wait_idle(timeout=60)
        five_xx = {k: v for k, v in tally.items() if isinstance(k, int) and k >= 500}
        if five_xx:
            failures.append(f"5xx responses: {five_xx}")
        if tally["transport_errors"]:
            failures.append(f"{tally['transport_errors']} transport errors, first: "
                            f"{tally.get('first_error')}")
        if tally["stream_errors"]:
            failures.append(f"{tally['stream_errors']} error events inside streams")
        if idle["tlaloc:kv_cache_pages_used"] != 0:
            failures.append(f"{idle['tlaloc:kv_cache_pages_used']:.0f} K/V pages still held")
        half = [rss for t, rss in samples if t >= args.seconds / 2]
        growth = None
        if half:
            growth = (max(half) - half[0]) / half[0]
            if args.seconds >= args.memory_after and growth > args.max_growth:
                failures.append(f"resident size grew {growth:.1%} over the second half "
                                f"(limit {args.max_growth:.0%})")
        rc = server.stop()
        if rc != 0:
            failures.append(f"the server exited with {rc}")
    finally:
        if server.proc.poll() is None:
            server.stop()

    statuses = {k: v for k, v in tally.items() if isinstance(k, int)}
    print(f"soak: {args.seconds:.0f} s, {args.workers} workers, {tally['requests']} requests "
          f"({tally['dropped']} dropped on purpose), statuses {statuses}")
    if samples:
        rss_mib = [rss / 2**20 for _, rss in samples]
        checked = "checked" if args.seconds >= args.memory_after else "not checked: run too short"
        print(f"  resident MiB: start {rss_mib[0]:.0f}, max {max(rss_mib):.0f}, end "
              f"{rss_mib[-1]:.0f}; growth over the second half "
              f"{'n/a' if growth is None else f'{growth:.1%}'} ({checked})")
    for f in failures:
        print(f"  FAIL {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
