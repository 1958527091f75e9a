"""Servers shared by the tests: the tiny fixture (with an API key), the tiny fixture with a small
body limit and one-second header and body timeouts (for the wire-level tests), SmolLM2 with a
zero queue and a small body limit, and SmolLM2 for the golden chat reply.

Tests that need a request still running when they act use SmolLM2, never the tiny fixture: a
SmolLM2 decode step reads its 0.54 GB of f32 weights, so 100 tokens take at least 0.54 s even at
100 GB/s of memory bandwidth, while the tiny fixture can finish hundreds of tokens in the time a
client takes to open its next connection."""

import json

import openai
import pytest

from serverctl import REPO, Server, required_env

API_KEY = "test-key"
# The bounds of the `bounded` server; the wire-level tests derive their waits from them.
BOUNDED_MAX_BODY_BYTES = 2000
BOUNDED_HEADER_READ_TIMEOUT_S = 1.0
BOUNDED_BODY_IDLE_TIMEOUT_S = 1.0


def golden(name: str) -> dict:
    return json.loads((REPO / "tests/data/goldens" / f"{name}.json").read_text())


@pytest.fixture(scope="session")
def tiny_artifact() -> str:
    return required_env("TLALOC_TINY_ARTIFACT")


@pytest.fixture(scope="session")
def tiny(tiny_artifact):
    server = Server(tiny_artifact, "tiny", "--api-key", API_KEY)
    yield server
    assert server.stop() == 0, server.log_text()


@pytest.fixture(scope="session")
def bounded(tiny_artifact):
    server = Server(tiny_artifact, "tiny", "--max-body-bytes", str(BOUNDED_MAX_BODY_BYTES),
                    "--header-read-timeout", str(BOUNDED_HEADER_READ_TIMEOUT_S),
                    "--body-idle-timeout", str(BOUNDED_BODY_IDLE_TIMEOUT_S))
    yield server
    assert server.stop() == 0, server.log_text()


@pytest.fixture(scope="session")
def strict():
    server = Server(required_env("TLALOC_SMOL_ARTIFACT"), "smol", "--max-queue", "0",
                    "--max-body-bytes", "2000")
    yield server
    assert server.stop() == 0, server.log_text()


@pytest.fixture(scope="session")
def smol():
    server = Server(required_env("TLALOC_SMOL_ARTIFACT"), "smol")
    yield server
    assert server.stop() == 0, server.log_text()


@pytest.fixture
def client(tiny) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{tiny.url}/v1", api_key=API_KEY, max_retries=0)
