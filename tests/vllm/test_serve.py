"""`vllm serve` on the artifact through the plugin, answered to the official `openai` client."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest
from conftest import MAX_NUM_SEQS, PREFILL_CHUNK, trusted_ids

START_TIMEOUT_S = 600


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def client(hf_dir, tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "vllm-serve.log"
    vllm = Path(sys.executable).with_name("vllm")
    cmd = [
        str(vllm), "serve", hf_dir, "--host", "127.0.0.1", "--port", str(port),
        "--served-model-name", "smol", "--max-num-seqs", str(MAX_NUM_SEQS),
        "--max-num-batched-tokens", str(PREFILL_CHUNK), "--enable-prefix-caching",
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ))
    api = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vllm serve exited {proc.returncode}:\n{log.read_text()[-4000:]}")
            try:
                api.models.list()
                break
            except openai.APIConnectionError:
                if time.monotonic() > deadline:
                    pytest.fail(f"vllm serve did not start:\n{log.read_text()[-4000:]}")
                time.sleep(1)
        yield api
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def case(goldens, name):
    return next(c for c in goldens if c["name"] == name)


def golden_text(hf_dir, ids):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(hf_dir).decode(ids)


def test_completion_matches_transformers(client, goldens, hf_dir):
    c = case(goldens, "capital")
    want = trusted_ids(c)[:12]
    r = client.completions.create(model="smol", prompt=c["text"], max_tokens=len(want), temperature=0)
    assert r.choices[0].text == golden_text(hf_dir, want)
    assert r.usage.completion_tokens == len(want)
    assert r.usage.prompt_tokens == len(c["prompt_ids"])


def test_chat_matches_transformers(client, goldens, hf_dir):
    c = case(goldens, "chat_capital")
    want = trusted_ids(c)
    eos = 2
    if eos in want:
        want = want[: want.index(eos)]
    r = client.chat.completions.create(
        model="smol", messages=c["messages"], max_tokens=32, temperature=0
    )
    assert r.choices[0].message.content == golden_text(hf_dir, want)


def test_streaming_equals_the_whole_answer(client, goldens):
    c = case(goldens, "paragraph")
    whole = client.completions.create(model="smol", prompt=c["text"], max_tokens=16, temperature=0)
    parts = [
        chunk.choices[0].text
        for chunk in client.completions.create(
            model="smol", prompt=c["text"], max_tokens=16, temperature=0, stream=True
        )
        if chunk.choices
    ]
    assert len(parts) > 1
    assert "".join(parts) == whole.choices[0].text


def test_logprobs_come_back(client, goldens):
    c = case(goldens, "numbers")
    r = client.completions.create(
        model="smol", prompt=c["text"], max_tokens=4, temperature=0, logprobs=2
    )
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == 4 and len(lp.token_logprobs) == 4
    assert all(v <= 0 for v in lp.token_logprobs)
    assert all(len(top) >= 1 for top in lp.top_logprobs)


def test_an_unimplemented_parameter_is_a_400_naming_it(client, goldens):
    with pytest.raises(openai.BadRequestError, match="presence_penalty"):
        client.completions.create(
            model="smol", prompt="Hello", max_tokens=4, presence_penalty=0.5
        )
