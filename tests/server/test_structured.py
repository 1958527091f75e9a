"""Structured outputs and logit_bias through the real OpenAI client: JSON schemas, JSON objects,
vLLM's `structured_outputs` (choice, regex, grammar), streamed constrained text, and every
refusal as a 400 naming its field.

SmolLM2-135M is the model that does not answer in valid JSON by itself: the same prompts without
the constraint are shown to fail the schema, and with it every reply parses and validates."""

import json
import re

import httpx
import jsonschema
import openai
import pytest

from test_server import AUTH, post

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 16},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}

PROMPTS = [
    "Describe a person as JSON with name, age and city.",
    "Give me a JSON record of a teacher from Paris.",
    "Invent a character for a story and answer in JSON.",
    "Who is your best friend? Reply with JSON.",
    "Tell me about a doctor who lives in Tokyo, in JSON format.",
]


def smol_client(smol) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{smol.url}/v1", api_key="unused", max_retries=0)


def person_format(name="person"):
    return {"type": "json_schema",
            "json_schema": {"name": name, "schema": PERSON, "strict": True}}


def validates(text: str, schema: dict) -> bool:
    try:
        jsonschema.validate(json.loads(text), schema)
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False
    return True


def ask(client, prompt, **kw):
    return client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": prompt}], max_tokens=60,
        temperature=0, **kw)


def test_a_schema_constrained_reply_validates_on_every_prompt_and_not_without_it(smol):
    client = smol_client(smol)
    free = [ask(client, p).choices[0].message.content for p in PROMPTS]
    free_valid = [validates(t, PERSON) for t in free]
    assert not any(free_valid), f"unconstrained SmolLM2 already answers valid JSON: {free}"
    for p in PROMPTS:
        choice = ask(client, p, response_format=person_format()).choices[0]
        assert validates(choice.message.content, PERSON), choice.message.content
        assert choice.finish_reason == "stop"


def test_sampled_choices_follow_the_schema_too(smol):
    r = smol_client(smol).chat.completions.create(
        model="smol", messages=[{"role": "user", "content": PROMPTS[0]}], max_tokens=60,
        temperature=1.0, seed=5, n=2, response_format=person_format())
    assert len(r.choices) == 2
    for choice in r.choices:
        assert validates(choice.message.content, PERSON), choice.message.content


def test_the_streamed_text_is_the_constrained_text(smol):
    client = smol_client(smol)
    whole = ask(client, PROMPTS[1], response_format=person_format()).choices[0].message.content
    stream = ask(client, PROMPTS[1], response_format=person_format(), stream=True)
    pieces, finish = [], None
    for chunk in stream:
        for c in chunk.choices:
            if c.delta.content:
                pieces.append(c.delta.content)
            finish = c.finish_reason or finish
    assert "".join(pieces) == whole
    assert validates(whole, PERSON)
    assert finish == "stop"


def test_json_object_gives_a_json_object_when_it_stops(smol):
    # Any object may nest without end (SmolLM2 does, for some prompts): a reply cut by its
    # budget ends `length` and is a prefix of an object; one that ends `stop` is an object.
    client = smol_client(smol)
    stopped = 0
    for p in PROMPTS:
        choice = ask(client, p, response_format={"type": "json_object"}).choices[0]
        assert choice.message.content.startswith("{"), choice.message.content
        if choice.finish_reason == "stop":
            assert isinstance(json.loads(choice.message.content), dict), choice.message.content
            stopped += 1
    assert stopped >= 1


def test_structured_outputs_choice_regex_and_grammar(smol):
    client = smol_client(smol)
    choices = ["positive", "negative", "neutral"]
    text = ask(client, "Is 'I love this movie' positive or negative?",
               extra_body={"structured_outputs": {"choice": choices}}).choices[0].message.content
    assert text in choices
    text = ask(client, "What is the phone number?",
               extra_body={"structured_outputs": {"regex": r"\d{3}-\d{4}"}}
               ).choices[0].message.content
    assert re.fullmatch(r"\d{3}-\d{4}", text), text
    grammar = 'start: "yes" | "no" | "maybe, " NUMBER "%"\nNUMBER: /[0-9]{1,2}/'
    text = ask(client, "Will it rain tomorrow?",
               extra_body={"structured_outputs": {"grammar": grammar}}).choices[0].message.content
    assert re.fullmatch(r"yes|no|maybe, [0-9]{1,2}%", text), text
    # The completions endpoint takes them as well.
    r = client.completions.create(model="smol", prompt="The answer is", max_tokens=10,
                                  temperature=0, extra_body={"structured_outputs": {"choice": choices}})
    assert r.choices[0].text in choices


def first_token_id(server, text):
    r = post(server, "/tokenize", {"prompt": text, "add_special_tokens": False}, headers={})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def test_logit_bias_bans_and_forces_tokens(smol):
    client = smol_client(smol)
    prompt = "The capital of France is"
    free = client.completions.create(model="smol", prompt=prompt, max_tokens=1, temperature=0)
    ids = first_token_id(smol, free.choices[0].text)
    assert len(ids) == 1
    banned = client.completions.create(model="smol", prompt=prompt, max_tokens=1, temperature=0,
                                       logit_bias={str(ids[0]): -100})
    assert banned.choices[0].text != free.choices[0].text
    forced_id = first_token_id(smol, " banana")[0]
    forced = client.completions.create(model="smol", prompt=prompt, max_tokens=3, temperature=0,
                                       logit_bias={str(forced_id): 100})
    detok = post(smol, "/detokenize", {"tokens": [forced_id] * 3}, headers={}).json()["prompt"]
    assert forced.choices[0].text == detok


CHAT = {"messages": [{"role": "user", "content": "x"}]}


@pytest.mark.parametrize("body,param", [
    ({**CHAT, "response_format": {"type": "json_schema", "json_schema": {
        "name": "bad", "schema": {"type": "object", "properties": {"a": {"type": "nonsense"}}}}}},
     "response_format.json_schema.schema"),
    ({**CHAT, "response_format": {"type": "json_schema", "json_schema": {
        "name": "bad", "schema": [1, 2]}}}, "response_format.json_schema.schema"),
    ({**CHAT, "structured_outputs": {"regex": "(unclosed"}}, "structured_outputs.regex"),
    ({**CHAT, "structured_outputs": {"grammar": "start: undefined_rule"}},
     "structured_outputs.grammar"),
    ({**CHAT, "structured_outputs": {"choice": []}}, "structured_outputs.choice"),
    ({**CHAT, "structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
    ({**CHAT, "structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}},
     "structured_outputs"),
    ({**CHAT, "logit_bias": {"abc": 1}}, "logit_bias"),
    ({**CHAT, "logit_bias": {"5": 101}}, "logit_bias"),
    ({**CHAT, "logit_bias": {"99999999": 1}}, "logit_bias"),
])
def test_structured_refusals_are_400_naming_the_field(tiny, body, param):
    for path, b in [("/v1/chat/completions", body)]:
        r = post(tiny, path, b)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == param, error
        assert error["message"]


def test_an_unknown_response_format_type_is_refused_by_name(tiny):
    r = post(tiny, "/v1/chat/completions", {**CHAT, "response_format": {"type": "xml"}})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].startswith("response_format"), r.text
    assert "xml" in r.json()["error"]["message"]
