"""The tlaloc backend inside the real tritonserver, through `tritonclient` and Triton's HTTP
generate extension, against transformers' greedy goldens for SmolLM2 (tests/data/goldens)."""

import json
import queue
import random
import socket
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import BROKEN_MODELS, REAPED_IDLE_MS, golden

SMOL = golden("SmolLM2-135M-Instruct")
RAW = [c for c in SMOL["cases"] if c["kind"] == "raw"]
# The artifact of run.sh: 16-token pages, a 128-token context.
BLOCK = 16


def sampling(max_tokens: int) -> str:
    # The goldens run greedy past the end-of-sequence token.
    return json.dumps({"temperature": 0, "max_tokens": max_tokens, "ignore_eos": True})


def generate_stream(triton, body: dict) -> list[dict]:
    """POSTs to generate_stream; the events, parsed."""
    import urllib.request
    request = urllib.request.Request(f"{triton.url}/v2/models/smol/generate_stream",
                                     data=json.dumps(body).encode(), method="POST")
    events = []
    with urllib.request.urlopen(request, timeout=600) as response:
        for line in response:
            line = line.decode().strip()
            if line.startswith("data: "):
                events.append(json.loads(line[len("data: "):]))
    return events


def ids_of(events: list[dict]) -> list[int]:
    out = []
    for e in events:
        ids = e.get("output_ids", [])
        out.extend(ids if isinstance(ids, list) else [ids])
    return out


@pytest.mark.parametrize("case", RAW, ids=[c["name"] for c in RAW])
def test_generate_stream_ids_equal_the_golden(triton, case):
    events = generate_stream(triton, {"text_input": case["text"], "stream": True,
                                      "sampling_parameters": sampling(case["new_tokens"])})
    assert all("error" not in e for e in events), events
    assert ids_of(events) == case["greedy_ids"]
    # One event per token (the last token rides on the final event unless the finish arrived
    # after the token was sent; then the final event has no token), the finish reason on the
    # last one only.
    assert [len(e["output_ids"]) if isinstance(e["output_ids"], list) else 1 for e in events
            ][: case["new_tokens"]] == [1] * case["new_tokens"]
    assert len(events) in (case["new_tokens"], case["new_tokens"] + 1)
    assert [e.get("finish_reason") for e in events] == [None] * (len(events) - 1) + ["length"]
    # The golden's text stops at its first end-of-sequence token; the stream goes on past it.
    text = "".join(e["text_output"] for e in events)
    assert text.startswith(case["text_out"]), (text, case["text_out"])


def test_generate_without_stream_answers_once_with_the_prompt_and_the_whole_text(triton):
    case = RAW[0]
    import urllib.request
    request = urllib.request.Request(
        f"{triton.url}/v2/models/smol/generate", method="POST",
        data=json.dumps({"text_input": case["text"],
                         "sampling_parameters": sampling(case["new_tokens"])}).encode())
    with urllib.request.urlopen(request, timeout=600) as response:
        body = json.loads(response.read())
    assert body["output_ids"] == case["greedy_ids"]
    # The prompt, then the text (the golden's text stops at its end-of-sequence token).
    assert body["text_output"].startswith(case["text"] + case["text_out"]), body["text_output"]
    streamed = generate_stream(triton, {"text_input": case["text"], "stream": True,
                                        "sampling_parameters": sampling(case["new_tokens"])})
    assert body["text_output"] == case["text"] + "".join(e["text_output"] for e in streamed)
    assert body["finish_reason"] == "length"


def test_generate_stops_at_the_end_of_sequence_token_without_ignore_eos(triton):
    case = RAW[0]
    eos = SMOL["eos_token_ids"][0]
    assert eos in case["greedy_ids"], "the case's golden passes an end-of-sequence token"
    events = generate_stream(triton, {"text_input": case["text"], "stream": True,
                                      "sampling_parameters": json.dumps({"max_tokens": 32})})
    ids = ids_of(events)
    assert ids == case["greedy_ids"][: case["greedy_ids"].index(eos) + 1]
    assert events[-1]["finish_reason"] == "stop"


def grpc_text_inputs(text: bytes, max_tokens: int):
    prompt = grpcclient.InferInput("text_input", [1], "BYTES")
    prompt.set_data_from_numpy(np.array([text], dtype=object))
    stream = grpcclient.InferInput("stream", [1], "BOOL")
    stream.set_data_from_numpy(np.array([True]))
    params = grpcclient.InferInput("sampling_parameters", [1], "BYTES")
    params.set_data_from_numpy(np.array([sampling(max_tokens).encode()], dtype=object))
    return [prompt, stream, params]


CANCELLED = "cancelled by the client; aborted and its K/V pages freed"


def wait_log(triton, predicate, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    while True:
        log = triton.log_text()
        if predicate(log) or time.monotonic() > deadline:
            return log
        time.sleep(0.05)


def test_a_grpc_stream_cancelled_aborts_the_request_and_frees_its_pages(triton):
    client = triton.grpc()
    responses = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    # 100 tokens: far more than arrive before the cancel (each decode step reads 0.5 GB).
    client.async_stream_infer("smol", grpc_text_inputs(b"The capital of France is", 100),
                              request_id="cancel-me")
    for _ in range(3):
        result, error = responses.get(timeout=300)
        assert error is None, error
    assert triton.wait_metric_at_least("tlaloc_kv_pages_used", "smol", 1) >= 1
    client.stop_stream(cancel_requests=True)
    # The backend names the aborted request (a request that ran to its end would not be).
    line = "request 'cancel-me'"
    log = wait_log(triton, lambda log: any(line in l and CANCELLED in l for l in log.splitlines()))
    assert any(line in l and CANCELLED in l for l in log.splitlines()), log[-3000:]
    assert triton.wait_metric("tlaloc_kv_pages_used", "smol", 0) == 0
    client.close()


def test_a_client_that_goes_away_mid_stream_frees_its_pages(triton):
    before = triton.log_text().count(CANCELLED)
    body = json.dumps({"text_input": "The capital of France is", "stream": True,
                       "sampling_parameters": sampling(100)}).encode()
    with socket.create_connection(("127.0.0.1", triton.http_port)) as s:
        s.sendall(b"POST /v2/models/smol/generate_stream HTTP/1.1\r\nHost: x\r\n"
                  b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        seen = b""
        while seen.count(b"data: ") < 2:
            chunk = s.recv(4096)
            assert chunk, seen
            seen += chunk
        assert triton.wait_metric_at_least("tlaloc_kv_pages_used", "smol", 1) >= 1
    log = wait_log(triton, lambda log: log.count(CANCELLED) > before)
    assert log.count(CANCELLED) == before + 1, log[-3000:]
    assert triton.wait_metric("tlaloc_kv_pages_used", "smol", 0) == 0


def test_per_request_refusals_name_the_input(triton):
    # A decoupled model takes gRPC streams only.
    client = triton.grpc()
    responses = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    client.async_stream_infer("smol", grpc_text_inputs(b"caf\xff", 4))
    _, error = responses.get(timeout=60)
    assert error is not None and "text_input refused: not UTF-8" in str(error), error
    bad = grpc_text_inputs(b"hello", 4)
    bad[2].set_data_from_numpy(np.array([b'{"best_of": 2}'], dtype=object))
    client.async_stream_infer("smol", bad)
    _, error = responses.get(timeout=60)
    assert error is not None and "sampling_parameters key `best_of` refused" in str(error), error
    client.stop_stream()
    client.close()


# Sequence mode.

def seq_infer(triton, ids, sequence_id, start=False, end=False, max_tokens=8, client=None,
              model="seq"):
    client = client or triton.http
    tokens = httpclient.InferInput("input_ids", [1, len(ids)], "INT32")
    tokens.set_data_from_numpy(np.array([ids], dtype=np.int32))
    params = httpclient.InferInput("sampling_parameters", [1, 1], "BYTES")
    params.set_data_from_numpy(np.array([[sampling(max_tokens).encode()]], dtype=object))
    result = client.infer(model, [tokens, params], sequence_id=sequence_id,
                          sequence_start=start, sequence_end=end)
    return result.as_numpy("output_ids")[0].tolist()


def golden_through_sequence(triton, case, sequence_id, chunk=8, client=None):
    """Generates the case's greedy ids in requests of `chunk` tokens: the first request is the
    prompt (START), each later one feeds the golden's next token as its one new token (its K/V
    was not computed yet: a sampled token enters the context when it is fed) and the last one
    ends the sequence. Returns the ids generated and fed, in order."""
    want = case["greedy_ids"]
    out = seq_infer(triton, case["prompt_ids"], sequence_id, start=True, max_tokens=chunk,
                    client=client)
    while len(out) < len(want):
        fed = want[len(out)]
        take = min(chunk, len(want) - len(out) - 1)
        last = len(out) + 1 + take >= len(want)
        out = out + [fed] + seq_infer(triton, [fed], sequence_id, end=last, max_tokens=take,
                                      client=client)
    return out


@pytest.mark.parametrize("case", RAW, ids=[c["name"] for c in RAW])
def test_sequence_mode_continues_parked_sequences_to_the_golden(triton, case):
    assert golden_through_sequence(triton, case, 1000 + RAW.index(case)) == case["greedy_ids"]
    assert triton.wait_metric("tlaloc_kv_pages_used", "seq", 0) == 0


def test_four_concurrent_sequences_equal_each_alone(triton):
    alone = {c["name"]: golden_through_sequence(triton, c, 2000 + i) for i, c in enumerate(RAW)}
    results = {}

    def run(i, case):
        client = httpclient.InferenceServerClient(f"127.0.0.1:{triton.http_port}",
                                                  network_timeout=600)
        try:
            results[case["name"]] = golden_through_sequence(triton, case, 3000 + i, client=client)
        finally:
            client.close()

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(RAW)]
    assert len(threads) == 4
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == alone
    assert alone == {c["name"]: c["greedy_ids"] for c in RAW}


def test_pages_are_held_between_requests_and_freed_on_end(triton):
    # 52 prompt tokens and 4 generated: 55 or 56 tokens of K/V (the last token enters the
    # context when it is fed), 4 pages either way.
    prompt = RAW[2]["prompt_ids"]
    assert len(prompt) == 52
    seq_infer(triton, prompt, 41, start=True, max_tokens=4)
    assert triton.wait_metric("tlaloc_kv_pages_used", "seq", 4) == 4
    assert triton.wait_metric("tlaloc_sequences_live", "seq", 1) == 1
    seq_infer(triton, [198], 41, end=True, max_tokens=2)
    assert triton.wait_metric("tlaloc_kv_pages_used", "seq", 0) == 0
    assert triton.wait_metric("tlaloc_sequences_live", "seq", 0) == 0


def test_idle_sequences_are_reaped_and_their_pages_freed(triton):
    # 5 prompt tokens and 4 generated: one page.
    seq_infer(triton, RAW[0]["prompt_ids"], 51, start=True, max_tokens=4, model="seq_reaped")
    assert triton.wait_metric("tlaloc_kv_pages_used", "seq_reaped", 1) == 1
    time.sleep(REAPED_IDLE_MS / 1000)
    assert triton.wait_metric("tlaloc_kv_pages_used", "seq_reaped", 0) == 0
    assert triton.wait_metric("tlaloc_sequences_live", "seq_reaped", 0) == 0
    assert "model seq_reaped: sequence 51 idle for" in triton.log_text()
    # The sequence is gone (Triton's own idle timeout, the same length, ends it there too).
    with pytest.raises(InferenceServerException):
        seq_infer(triton, [198], 51, max_tokens=2, model="seq_reaped")


def test_a_full_pool_refuses_a_start_with_unavailable_naming_free_and_total_pages(triton):
    total = int(triton.metric("tlaloc_kv_pages_total", "seq"))
    assert triton.wait_metric("tlaloc_kv_pages_used", "seq", 0) == 0
    rng = random.Random(7)
    # Distinct random prompts (no shared prefix blocks) of 100 tokens and 8 generated: 107 or
    # 108 tokens of K/V, 7 pages each, parked; as many as fit.
    prompt_tokens, max_tokens = 100, 8
    pages = -(-(prompt_tokens + max_tokens) // BLOCK)
    fit = total // pages
    assert fit >= 1
    started = []
    try:
        for k in range(fit):
            sid = 600 + k
            seq_infer(triton, [rng.randrange(100, 40000) for _ in range(prompt_tokens)], sid,
                      start=True, max_tokens=max_tokens)
            started.append(sid)
        assert triton.wait_metric("tlaloc_kv_pages_used", "seq", fit * pages) == fit * pages
        with pytest.raises(InferenceServerException) as refused:
            seq_infer(triton, [rng.randrange(100, 40000) for _ in range(prompt_tokens)], 699,
                      start=True, max_tokens=max_tokens)
        message = str(refused.value)
        free = total - fit * pages
        assert (f"START of sequence 699 refused: it needs {pages} K/V pages and the pool has "
                f"{free} free of {total} total") in message, message
        assert refused.value.status() == "503", refused.value.status()
        # Triton's sequence batcher holds the refused sequence's slot until an END (or its idle
        # timeout); the backend never started it, so the END is refused as unknown.
        with pytest.raises(InferenceServerException, match="sequence 699 is unknown"):
            seq_infer(triton, [198], 699, end=True, max_tokens=1)
    finally:
        for sid in started:
            seq_infer(triton, [198], sid, end=True, max_tokens=1)
    assert triton.wait_metric("tlaloc_kv_pages_used", "seq", 0) == 0


def test_a_restart_of_a_live_sequence_frees_its_old_pages_first(triton):
    # 52 + 8 tokens: 4 pages; then 5 + 8 tokens: 1 page.
    seq_infer(triton, RAW[2]["prompt_ids"], 71, start=True, max_tokens=8)
    assert triton.wait_metric("tlaloc_kv_pages_used", "seq", 4) == 4
    out = seq_infer(triton, RAW[0]["prompt_ids"], 71, start=True, max_tokens=8)
    assert out == RAW[0]["greedy_ids"][:8]
    assert triton.wait_metric("tlaloc_kv_pages_used", "seq", 1) == 1
    seq_infer(triton, [198], 71, end=True, max_tokens=1)
    assert triton.wait_metric("tlaloc_kv_pages_used", "seq", 0) == 0


def test_a_string_correlation_id_is_refused_by_name(triton):
    with pytest.raises(InferenceServerException, match="correlation ID refused") as refused:
        seq_infer(triton, [504], "conversation-1", start=True, max_tokens=1)
    assert "send a numeric sequence_id" in str(refused.value)
    # Ends Triton's slot for it.
    with pytest.raises(InferenceServerException, match="correlation ID refused"):
        seq_infer(triton, [504], "conversation-1", end=True, max_tokens=1)


@pytest.mark.parametrize("name, wanted", [
    ("two_instances", "instance_group count 2 refused"),
    ("unknown_parameter", "parameter `temperature` refused"),
    ("no_corrid", "the sequence control CONTROL_SEQUENCE_CORRID is missing"),
    ("string_corrid", "the CORRID control CORRID of TYPE_STRING refused"),
    ("batch_too_large", "max_batch_size 64 refused; the artifact's top decode batch is 4"),
])
def test_load_time_refusals_name_the_setting(triton, name, wanted):
    assert name in BROKEN_MODELS
    with pytest.raises(InferenceServerException) as refused:
        triton.http.load_model(name)
    assert wanted in str(refused.value), str(refused.value)
