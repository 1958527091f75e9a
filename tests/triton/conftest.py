"""The real tritonserver (from the nvidia-pytriton wheel) with the tlaloc backend, on random
loopback ports, one per test session and plugin (tests/triton/run.sh sets the environment).

The model repository is written by scripts/triton_model_repo.py: `smol` (generate mode), `seq`
and `seq_reaped` (sequence mode, long and short idle timeouts) and the misconfigured models of the load-time
refusal tests. The server runs in explicit model-control mode; `smol` loads first (it fills the
compile cache), `seq` after it, and each refusal test loads its own model."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

REPO = Path(__file__).resolve().parents[2]
# `seq` keeps idle sequences for a minute (longer than any test's pauses on a slow machine);
# `seq_reaped` reaps them after REAPED_IDLE_MS.
SEQUENCE_IDLE_MS = 60000
REAPED_IDLE_MS = 2000
# Misconfigured models: name -> (mode, extra arguments of triton_model_repo.py).
BROKEN_MODELS = {
    "two_instances": ("generate", ["--instances", "2"]),
    "unknown_parameter": ("generate", ["--parameter", "temperature=0.7"]),
    "no_corrid": ("sequence", ["--no-corrid"]),
    "string_corrid": ("sequence", ["--corrid-type", "TYPE_STRING"]),
    "batch_too_large": ("sequence", ["--max-batch-size", "64"]),
}


def required_env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.exit(f"{name} is not set; run the tests through tests/triton/run.sh", returncode=2)
    return value


def golden(name: str) -> dict:
    return json.loads((REPO / "tests/data/goldens" / f"{name}.json").read_text())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_model(repo: Path, name: str, mode: str, artifact: str, plugin: str, cache: str, *extra):
    subprocess.run(
        [sys.executable, str(REPO / "scripts/triton_model_repo.py"), "--artifact", artifact,
         "--repo", str(repo), "--name", name, "--mode", mode, "--plugin", plugin,
         "--compile-cache", cache, *extra],
        check=True, stdout=subprocess.DEVNULL)


class Triton:
    """A running tritonserver and its log."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.log_path = workdir / "tritonserver.log"
        self.http_port, self.grpc_port, self.metrics_port = free_port(), free_port(), free_port()
        server = Path(required_env("TLALOC_TRITONSERVER"))
        self.log = open(self.log_path, "w")
        self.process = subprocess.Popen(
            [str(server), "--model-repository", str(workdir / "models"),
             "--backend-directory", str(workdir / "backends"),
             "--model-control-mode", "explicit", "--strict-readiness", "false",
             "--http-address", "127.0.0.1", "--http-port", str(self.http_port),
             "--grpc-address", "127.0.0.1", "--grpc-port", str(self.grpc_port),
             "--metrics-address", "127.0.0.1", "--metrics-port", str(self.metrics_port),
             "--allow-metrics", "true", "--allow-gpu-metrics", "false", "--allow-cpu-metrics", "false",
             "--log-info", "true", "--exit-timeout-secs", "5"],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.http = httpclient.InferenceServerClient(f"127.0.0.1:{self.http_port}", network_timeout=600)
        deadline = time.monotonic() + 60
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"tritonserver exited {self.process.returncode}:\n{self.log_text()}")
            try:
                if self.http.is_server_live():
                    break
            except Exception:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"tritonserver did not come up:\n{self.log_text()}")
            time.sleep(0.2)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def grpc(self) -> grpcclient.InferenceServerClient:
        return grpcclient.InferenceServerClient(f"127.0.0.1:{self.grpc_port}")

    def log_text(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return self.log_path.read_text(errors="replace")

    def metric(self, name: str, model: str) -> float:
        import urllib.request
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics") as r:
            for line in r.read().decode().splitlines():
                if line.startswith(f'{name}{{model="{model}"}}'):
                    return float(line.split()[-1])
        raise AssertionError(f"no metric {name} for model {model}")

    def wait_metric(self, name: str, model: str, want: float, timeout: float = 30) -> float:
        """Polls the metric until it equals `want` (the gauges refresh every 50 ms); returns the
        last value read."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.metric(name, model)
            if value == want or time.monotonic() > deadline:
                return value
            time.sleep(0.05)

    def wait_metric_at_least(self, name: str, model: str, least: float, timeout: float = 10) -> float:
        """Polls the metric until it is at least `least` (the gauges lag the engine by up to
        their 50 ms refresh); returns the last value read."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.metric(name, model)
            if value >= least or time.monotonic() > deadline:
                return value
            time.sleep(0.01)

    def stop(self) -> int:
        """SIGTERM by PID; the exit status."""
        self.http.close()
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        self.log.close()
        return code


@pytest.fixture(scope="session")
def triton(tmp_path_factory):
    artifact = required_env("TLALOC_TRITON_ARTIFACT")
    plugin = required_env("TLALOC_TRITON_PLUGIN")
    cache = required_env("TLALOC_TRITON_COMPILE_CACHE")
    workdir = tmp_path_factory.mktemp("triton")
    backend_dir = workdir / "backends" / "tlaloc"
    backend_dir.mkdir(parents=True)
    (backend_dir / "libtriton_tlaloc.so").symlink_to(Path(required_env("TLALOC_TRITON_BACKEND")).resolve())
    models = workdir / "models"
    write_model(models, "smol", "generate", artifact, plugin, cache)
    write_model(models, "seq", "sequence", artifact, plugin, cache, "--idle-ms", str(SEQUENCE_IDLE_MS))
    write_model(models, "seq_reaped", "sequence", artifact, plugin, cache, "--idle-ms", str(REAPED_IDLE_MS))
    for name, (mode, extra) in BROKEN_MODELS.items():
        write_model(models, name, mode, artifact, plugin, cache, *extra)
    server = Triton(workdir)
    try:
        server.http.load_model("smol")
        server.http.load_model("seq")
        server.http.load_model("seq_reaped")
    except Exception:
        server.stop()
        print(server.log_text())
        raise
    yield server
    code = server.stop()
    assert code == 0, server.log_text()
