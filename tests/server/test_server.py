"""`tlaloc serve` through the real OpenAI client, against transformers' golden outputs."""

import json
import math
import threading
import time

import httpx
import openai
import pytest

from conftest import API_KEY, golden
from serverctl import Server

TINY = golden("tiny-llama-tied")
SMOL = golden("SmolLM2-135M-Instruct")
AUTH = {"Authorization": f"Bearer {API_KEY}"}


def expected_of(case: dict) -> tuple[str, str, int]:
    """transformers' greedy text up to the first EOS, the finish reason, the token count."""
    ids, eos = case["greedy_ids"], TINY["eos_token_ids"]
    cut = next((i for i, t in enumerate(ids) if t in eos), None)
    if cut is None:
        return case["text_out"], "length", len(ids)
    return case["text_out"], "stop", cut + 1


def prompt_of(case: dict):
    return case["text"] if case["kind"] == "raw" else case["prompt_ids"]


def test_health_ready_and_models(tiny, client):
    assert httpx.get(f"{tiny.url}/health").status_code == 200
    assert httpx.get(f"{tiny.url}/ready").status_code == 200
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]


@pytest.mark.parametrize("case", TINY["cases"], ids=lambda c: c["name"])
def test_completion_equals_transformers_greedy(client, case):
    text, finish, count = expected_of(case)
    r = client.completions.create(model="tiny", prompt=prompt_of(case),
                                  max_tokens=case["new_tokens"], temperature=0)
    assert r.choices[0].text == text
    assert r.choices[0].finish_reason == finish
    assert r.usage.prompt_tokens == len(case["prompt_ids"])
    assert r.usage.completion_tokens == count
    assert r.usage.total_tokens == count + len(case["prompt_ids"])


@pytest.mark.parametrize("case", TINY["cases"][:3], ids=lambda c: c["name"])
def test_streamed_completion_equals_transformers_greedy(client, case):
    text, finish, count = expected_of(case)
    stream = client.completions.create(model="tiny", prompt=prompt_of(case),
                                       max_tokens=case["new_tokens"], temperature=0,
                                       stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == finish
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == count
    assert chunks[-1].usage.prompt_tokens == len(case["prompt_ids"])


def test_chat_streamed_equals_unstreamed_and_counts_template_tokens(tiny, client):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}]
    counted = httpx.post(f"{tiny.url}/tokenize", headers=AUTH,
                         json={"messages": messages}).json()["count"]
    r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=12,
                                       temperature=0, extra_body={"ignore_eos": True})
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == counted
    assert r.usage.completion_tokens == 12
    stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=12,
                                            temperature=0, stream=True,
                                            extra_body={"ignore_eos": True},
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == r.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == 12


def test_golden_chat_reply(smol):
    client = openai.OpenAI(base_url=f"{smol.url}/v1", api_key="unused", max_retries=0)
    chats = [c for c in SMOL["cases"] if c["kind"] == "chat"]
    assert chats, "the SmolLM2 golden file has chat cases"
    for case in chats:
        r = client.chat.completions.create(model="smol", messages=case["messages"],
                                           max_tokens=case["new_tokens"], temperature=0)
        assert r.usage.prompt_tokens == len(case["prompt_ids"]), case["name"]
        assert r.choices[0].message.content == case["text_out"], case["name"]
        eos_at = next((i for i, t in enumerate(case["greedy_ids"]) if t in SMOL["eos_token_ids"]),
                      None)
        if eos_at is not None:
            assert r.choices[0].finish_reason == "stop"
            assert r.usage.completion_tokens == eos_at + 1


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_cut_before_the_stop_and_do_not_leak(client, stream):
    case = next(c for c in TINY["cases"] if c["name"] == "capital")
    full = case["text_out"]
    stop = full.split()[2]  # a word in the middle of the reply
    expected = full[: full.index(stop)]
    r = client.completions.create(model="tiny", prompt=case["text"], max_tokens=16,
                                  temperature=0, stop=[stop, "never appears"], stream=stream)
    if stream:
        chunks = list(r)
        text = "".join(c.choices[0].text for c in chunks)
        finish = chunks[-1].choices[0].finish_reason
    else:
        text, finish = r.choices[0].text, r.choices[0].finish_reason
    assert text == expected
    assert finish == "stop"


def test_n2_greedy_choices_both_equal_the_golden_and_seeded_sampling_repeats(client):
    case = TINY["cases"][0]
    text, _, count = expected_of(case)
    r = client.completions.create(model="tiny", prompt=case["prompt_ids"], max_tokens=16,
                                  temperature=0, n=2)
    assert sorted(c.index for c in r.choices) == [0, 1]
    assert [c.text for c in r.choices] == [text, text]
    assert r.usage.completion_tokens == 2 * count
    assert r.usage.prompt_tokens == len(case["prompt_ids"])

    def sampled():
        s = client.completions.create(model="tiny", prompt=case["prompt_ids"], max_tokens=16,
                                      temperature=1.0, seed=1234, n=2)
        return [c.text for c in sorted(s.choices, key=lambda c: c.index)]

    first = sampled()
    assert sampled() == first
    assert first[0] != first[1], "choices draw with different seeds"


def test_completion_logprobs_agree_with_transformers_logits(client):
    case = TINY["cases"][0]
    r = client.completions.create(model="tiny", prompt=case["prompt_ids"], max_tokens=8,
                                  temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 8
    for k in range(8):
        step = case["steps"][k]
        top = lp.top_logprobs[k]
        assert len(top) == 3
        values = sorted(top.values(), reverse=True)
        # log-softmax keeps differences of logits.
        assert math.isclose(values[0] - values[1], step["top_logits"][0] - step["top_logits"][1],
                            rel_tol=1e-3, abs_tol=1e-3)
        assert math.isclose(lp.token_logprobs[k], values[0], abs_tol=1e-5)
        assert lp.token_logprobs[k] <= 0
    assert "".join(lp.tokens) == r.choices[0].text


def test_chat_logprobs_shape(client):
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}],
                                       max_tokens=4, temperature=0, logprobs=True, top_logprobs=2,
                                       extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert len(content) == 4
    for entry in content:
        assert len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].token == entry.token
        assert math.isclose(entry.top_logprobs[0].logprob, entry.logprob, abs_tol=1e-6)
        assert bytes(entry.bytes).decode() == entry.token


def post(server, path, body, headers=AUTH, **kw):
    """Posts `body` as JSON; a str or bytes body is sent as it is, labelled JSON."""
    if isinstance(body, (str, bytes)):
        headers = {"Content-Type": "application/json", **headers}
        return httpx.post(f"{server.url}{path}", headers=headers, timeout=30, content=body, **kw)
    return httpx.post(f"{server.url}{path}", headers=headers, timeout=30, json=body, **kw)


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", '{"prompt": "Hi", ', "body"),
    ("/v1/completions", {"model": "gpt-4", "prompt": "Hi"}, "model"),
    ("/v1/completions", {"prompt": [5] * 200, "max_tokens": 100}, "max_tokens"),
    ("/v1/completions", {"prompt": "Hi", "temperature": 7}, "temperature"),
    ("/v1/completions", {"prompt": "Hi", "top_p": 1.5}, "top_p"),
    ("/v1/completions", {"prompt": "Hi", "n": 0}, "n"),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {"prompt": "Hi", "logprobs": 99}, "logprobs"),
    ("/v1/completions", {"prompt": "Hi", "presence_penalty": 5}, "presence_penalty"),
    ("/v1/completions", {"prompt": "Hi", "best_of": 3}, "best_of"),
    ("/v1/completions", {"prompt": "Hi", "functions": []}, "functions"),
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]},
     "messages[0].role"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "max_completion_tokens": 1000}, "max_completion_tokens"),
    ("/v1/completions", '{"prompt": "Hi"} {"prompt": "again"}', "body"),
    ("/v1/completions", {"model": None, "prompt": "Hi"}, "model"),
    ("/v1/chat/completions", {"model": None, "messages": [{"role": "user", "content": "x"}]},
     "model"),
    ("/v1/chat/completions", {"messages": [{"role": "user"}]}, "messages[0].content"),
    ("/v1/chat/completions", {"messages": [{"role": "system", "content": None},
                                           {"role": "user", "content": "x"}]},
     "messages[0].content"),
])
def test_invalid_requests_are_400_naming_the_field(tiny, path, body, param):
    r = post(tiny, path, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert error["message"]


def test_the_openai_client_sees_refusals_as_its_own_errors(tiny, client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="other-model", prompt="Hi", max_tokens=2)
    assert e.value.status_code == 400
    assert "other-model" in str(e.value)
    wrong = openai.OpenAI(base_url=f"{tiny.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        wrong.completions.create(model="tiny", prompt="Hi", max_tokens=2)
    assert e.value.status_code == 401


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer nope"},
                                     {"Authorization": API_KEY}])
def test_missing_or_wrong_api_key_is_401(tiny, headers):
    r = post(tiny, "/v1/completions", {"prompt": "Hi", "max_tokens": 1}, headers=headers)
    assert r.status_code == 401
    assert r.json()["error"]["type"] == "authentication_error"
    assert httpx.get(f"{tiny.url}/v1/models", headers=headers).status_code == 401


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_a_body_not_sent_as_application_json_is_415(tiny, content_type):
    headers = dict(AUTH)
    if content_type:
        headers["Content-Type"] = content_type
    r = httpx.post(f"{tiny.url}/v1/completions", headers=headers, timeout=30,
                   content=json.dumps({"prompt": "Hi", "max_tokens": 1}))
    assert r.status_code == 415, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert "application/json" in error["message"]


@pytest.mark.parametrize("scheme", ["bearer", "BEARER"])
def test_the_bearer_scheme_is_case_insensitive(tiny, scheme):
    headers = {"Authorization": f"{scheme} {API_KEY}"}
    assert httpx.get(f"{tiny.url}/v1/models", headers=headers).status_code == 200
    r = post(tiny, "/v1/completions", {"prompt": "Hi", "max_tokens": 1}, headers=headers)
    assert r.status_code == 200, r.text


def test_created_is_the_time_of_each_response(client):
    # The served model's `created` is the server's start; wait until a later second, so that a
    # response stamped with the start could not pass.
    started = client.models.list().data[0].created
    while int(time.time()) <= started:
        time.sleep(0.05)
    before = int(time.time())
    r = client.completions.create(model="tiny", prompt="Hi", max_tokens=2)
    chat = client.chat.completions.create(model="tiny", max_tokens=2,
                                          messages=[{"role": "user", "content": "Hi"}])
    chunks = list(client.completions.create(model="tiny", prompt="Hi", max_tokens=3,
                                            stream=True))
    after = int(time.time())
    assert before <= r.created <= after
    assert before <= chat.created <= after
    assert len({c.created for c in chunks}) == 1
    assert before <= chunks[0].created <= after


def test_body_over_the_limit_is_413(strict):
    r = post(strict, "/v1/completions", {"prompt": "x" * 5000, "max_tokens": 1}, headers={})
    assert r.status_code == 413
    assert "2000" in r.json()["error"]["message"]


def test_full_queue_is_429_with_retry_after(strict):
    # No queue: the server holds what one decode step runs (SmolLM2's top batch bucket, 2
    # rows), then refuses. 100 tokens each keep both running (see conftest).
    held = []
    with httpx.Client(timeout=60) as c:
        for _ in range(2):
            cm = c.stream("POST", f"{strict.url}/v1/completions",
                          json={"prompt": "Hi", "max_tokens": 100, "stream": True,
                                "ignore_eos": True})
            r = cm.__enter__()
            assert r.status_code == 200
            held.append((cm, r))
        refused = c.post(f"{strict.url}/v1/completions",
                         json={"prompt": "Hi", "max_tokens": 1})
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["type"] == "rate_limit_error"
        for cm, _ in held:
            cm.__exit__(None, None, None)
    m = strict.wait_idle()
    assert m["tlaloc:kv_cache_pages_used"] == 0


def test_disconnect_mid_stream_gives_the_pages_back(smol):
    # SmolLM2, so that the two streams are still running when the client goes (see conftest).
    before = smol.wait_idle()
    with httpx.Client(timeout=60) as c:
        with c.stream("POST", f"{smol.url}/v1/completions",
                      json={"prompt": "Hi", "max_tokens": 100, "stream": True, "n": 2,
                            "ignore_eos": True}) as r:
            lines = r.iter_lines()
            seen = 0
            for line in lines:
                if line.startswith("data: "):
                    seen += 1
                if seen == 3:
                    break
            during = smol.metrics()
    after = smol.wait_idle()
    assert during["tlaloc:kv_cache_pages_used"] > 0 or during["tlaloc:generation_tokens_total"] > \
        before["tlaloc:generation_tokens_total"]
    assert after["tlaloc:kv_cache_pages_used"] == 0
    assert after["tlaloc:num_requests_running"] == 0
    aborted = 'tlaloc:request_success_total{finished_reason="abort"}'
    assert after.get(aborted, 0) >= before.get(aborted, 0) + 1
    assert after["tlaloc:generation_tokens_total"] - before["tlaloc:generation_tokens_total"] < 200


def test_disconnect_of_a_plain_request_gives_the_pages_back(smol):
    before = smol.wait_idle()
    # 100 tokens take at least 0.54 s (see conftest); the client gives up after 0.3 s.
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{smol.url}/v1/completions", timeout=0.3,
                   json={"prompt": "Once upon a time", "max_tokens": 100, "ignore_eos": True})
    after = smol.wait_idle()
    assert after["tlaloc:kv_cache_pages_used"] == 0
    assert after["tlaloc:generation_tokens_total"] - before["tlaloc:generation_tokens_total"] < 100


def test_sigterm_during_a_stream_finishes_it_and_exits_zero():
    from serverctl import required_env
    server = Server(required_env("TLALOC_SMOL_ARTIFACT"), "smol")
    try:
        events = []
        with httpx.Client(timeout=120) as c:
            with c.stream("POST", f"{server.url}/v1/completions",
                          json={"prompt": "Once upon a time", "max_tokens": 24,
                                "ignore_eos": True, "stream": True,
                                "stream_options": {"include_usage": True}}) as r:
                for line in r.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    events.append(line[len("data: "):])
                    if len(events) == 1:
                        server.terminate()
                        time.sleep(0.5)
                        with pytest.raises(httpx.HTTPError):
                            httpx.get(f"{server.url}/health", timeout=2)
        assert events[-1] == "[DONE]"
        usage = json.loads(events[-2])["usage"]
        assert usage["completion_tokens"] == 24
        assert server.proc.wait(60) == 0, server.log_text()
    finally:
        server.stop()
