#!/usr/bin/env python3
"""Tokens/s and time to first token through Triton (the tlaloc backend, `generate_stream`)
against `tlaloc serve` (`/v1/completions`, streamed) on the same artifact and plugin, one server
at a time, greedy with `ignore_eos`, at concurrency 1 and 4.

    python3 scripts/bench_triton.py --tritonserver BIN --backend libtriton_tlaloc.so \
        --tlaloc target/release/tlaloc --artifact ART --plugin PLUGIN.so

Prints a Markdown table (medians over the requests of each run; tokens/s is all tokens over the
run's wall time).
"""

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROMPTS = [c["text"] for c in json.loads(
    (REPO / "tests/data/goldens/SmolLM2-135M-Instruct.json").read_text())["cases"] if c["kind"] == "raw"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, process, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} not ready")


def stream(url: str, body: dict, token_count) -> tuple[float, float, int]:
    """(time to first token, total time, tokens) of one streamed request."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    first = None
    tokens = 0
    with urllib.request.urlopen(request, timeout=900) as response:
        for line in response:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            has_token, n = token_count(json.loads(line[6:]))
            if has_token and first is None:
                first = time.perf_counter() - start
            tokens += n
    return first or 0.0, time.perf_counter() - start, tokens


def run(url, make_body, token_count, requests: int, concurrency: int) -> dict:
    results = []
    lock = threading.Lock()
    queue = list(range(requests))

    def worker():
        while True:
            with lock:
                if not queue:
                    return
                i = queue.pop()
            r = stream(url, make_body(PROMPTS[i % len(PROMPTS)]), token_count)
            with lock:
                results.append(r)

    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    return {
        "ttft_ms": statistics.median(r[0] for r in results) * 1000,
        "tokens_per_s": sum(r[2] for r in results) / wall,
    }


def triton_ids(event: dict) -> tuple[bool, int]:
    """(whether the event carries a token, tokens it carries)."""
    ids = event.get("output_ids", [])
    n = len(ids) if isinstance(ids, list) else 1
    return n > 0, n


def openai_tokens(event: dict) -> tuple[bool, int]:
    """The first chunk with text marks the first token; the usage chunk counts them all."""
    usage = event.get("usage") or {}
    has_text = any(c.get("text") for c in event.get("choices", []))
    return has_text, int(usage.get("completion_tokens", 0))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tritonserver", required=True)
    p.add_argument("--backend", required=True)
    p.add_argument("--tlaloc", required=True)
    p.add_argument("--artifact", required=True)
    p.add_argument("--plugin", required=True)
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-triton-"))
    backend = work / "backends" / "tlaloc"
    backend.mkdir(parents=True)
    (backend / "libtriton_tlaloc.so").symlink_to(Path(args.backend).resolve())
    subprocess.run([sys.executable, str(REPO / "scripts/triton_model_repo.py"), "--artifact", args.artifact,
                    "--repo", str(work / "models"), "--name", "smol", "--mode", "generate",
                    "--plugin", args.plugin], check=True, stdout=subprocess.DEVNULL)
    params = json.dumps({"temperature": 0, "max_tokens": args.max_tokens, "ignore_eos": True})
    rows = {}

    http = free_port()
    server = subprocess.Popen(
        [args.tritonserver, "--model-repository", str(work / "models"), "--backend-directory",
         str(work / "backends"), "--http-address", "127.0.0.1", "--http-port", str(http),
         "--grpc-port", str(free_port()), "--metrics-port", str(free_port())],
        stdout=open(work / "triton.log", "w"), stderr=subprocess.STDOUT)
    try:
        wait_ready(f"http://127.0.0.1:{http}/v2/health/ready", server)
        url = f"http://127.0.0.1:{http}/v2/models/smol/generate_stream"
        body = lambda text: {"text_input": text, "stream": True, "sampling_parameters": params}
        run(url, body, triton_ids, 1, 1)
        rows["triton"] = {c: run(url, body, triton_ids, args.requests, c) for c in (1, 4)}
    finally:
        server.terminate()
        server.wait()

    port = free_port()
    server = subprocess.Popen(
        [args.tlaloc, "serve", "--artifact", args.artifact, "--plugin", args.plugin,
         "--port", str(port), "--served-model-name", "smol"],
        stdout=open(work / "serve.log", "w"), stderr=subprocess.STDOUT)
    try:
        wait_ready(f"http://127.0.0.1:{port}/ready", server)
        url = f"http://127.0.0.1:{port}/v1/completions"
        body = lambda text: {"model": "smol", "prompt": text, "max_tokens": args.max_tokens,
                             "temperature": 0, "stream": True, "ignore_eos": True,
                             "stream_options": {"include_usage": True}}
        run(url, body, openai_tokens, 1, 1)
        rows["serve"] = {c: run(url, body, openai_tokens, args.requests, c) for c in (1, 4)}
    finally:
        server.terminate()
        server.wait()

    print("| concurrency | measure | Triton + tlaloc backend | tlaloc serve | Triton / serve |")
    print("| ---: | --- | ---: | ---: | ---: |")
    for c in (1, 4):
        t, s = rows["triton"][c], rows["serve"][c]
        print(f"| {c} | tokens/s | {t['tokens_per_s']:.1f} | {s['tokens_per_s']:.1f} | "
              f"{t['tokens_per_s'] / s['tokens_per_s']:.2f} |")
        print(f"| {c} | time to first token, median, ms | {t['ttft_ms']:.0f} | {s['ttft_ms']:.0f} | "
              f"{t['ttft_ms'] / s['ttft_ms']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
