"""Starting and stopping `tlaloc serve` for the server tests and the load test."""

import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
HOW = "run `bash tests/server/run.sh` (it builds the artifacts and sets the environment)"


def required_env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(f"environment variable {name} is not set; {HOW}")
    return value


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One `tlaloc serve` process on a free port; its log goes to a temporary file."""

    def __init__(self, artifact: str, name: str, *extra: str, binary: str | None = None,
                 plugin: str | None = None, ready_timeout: float = 600.0):
        self.binary = binary or required_env("TLALOC")
        self.plugin = plugin or required_env("TLALOC_SERVER_PLUGIN")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.name = name
        self.log = tempfile.NamedTemporaryFile(prefix=f"tlaloc-serve-{name}-", suffix=".log",
                                               delete=False)
        args = [self.binary, "serve", "--artifact", artifact, "--plugin", self.plugin,
                "--port", str(self.port), "--served-model-name", name, *extra]
        env = dict(os.environ, RUST_LOG=os.environ.get("RUST_LOG", "info"), NO_COLOR="1")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self._wait_ready(ready_timeout)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tlaloc serve exited with {self.proc.returncode}:\n{self.log_text()}")
            try:
                if httpx.get(f"{self.url}/ready", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"tlaloc serve not ready after {timeout} s:\n{self.log_text()}")

    def log_text(self) -> str:
        """The end of the server's log (kept on disk unless the server exited 0)."""
        path = Path(self.log.name)
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def terminate(self) -> None:
        """Sends SIGTERM (graceful shutdown) without waiting."""
        self.proc.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, then waits; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.returncode == 0:
            Path(self.log.name).unlink(missing_ok=True)
        return self.proc.returncode

    def metrics(self) -> dict[str, float]:
        """The unlabelled samples of /metrics, plus labelled ones under their full name."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def wait_idle(self, timeout: float = 30.0) -> dict[str, float]:
        """Waits until no sequence runs or waits and no K/V page is held."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            idle = (m["tlaloc:num_requests_running"] == 0 and m["tlaloc:num_requests_waiting"] == 0
                    and m["tlaloc:kv_cache_pages_used"] == 0)
            if idle or time.monotonic() > deadline:
                return m
            time.sleep(0.05)
