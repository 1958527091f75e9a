"""Tool calling through the real OpenAI client: `tool_choice` `required` and a named function
enforced with the grammar (every call's arguments parse and validate against its tool's schema,
on every prompt of a set), streamed tool-call deltas reassembled equal to the whole reply, a
call round-tripped through a second turn with a `role: "tool"` message, `none` leaving the reply
free, `auto` refused without `--tool-call-parser` and read with it, and every refusal a 400
naming its field.

SmolLM2-135M's chat template ignores `tools` (its replies are not calls unless enforced), so the
`auto` path is shown on a server started with `--tool-call-parser hermes` whose reply is made to
take the Hermes format by a grammar."""

import json

import jsonschema
import openai
import pytest

from serverctl import Server
from test_server import post

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 16},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"zone": {"type": "string", "maxLength": 12}},
    "required": ["zone"],
    "additionalProperties": False,
}
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather",
                                      "description": "The weather in a city now.",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time",
                                      "description": "The time in a time zone.",
                                      "parameters": TIME}},
]
PROMPTS = [
    "What is the weather like in Paris?",
    "Is it raining in Tokyo right now?",
    "What time is it in New York?",
    "Should I take an umbrella in London today?",
]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def smol_client(smol) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{smol.url}/v1", api_key="unused", max_retries=0)


def ask(client, prompt, messages=None, **kw):
    return client.chat.completions.create(
        model=kw.pop("model", "smol"),
        messages=messages or [{"role": "user", "content": prompt}],
        max_tokens=kw.pop("max_tokens", 60), temperature=0, **kw)


def check_call(call, names=SCHEMAS):
    assert call.type == "function"
    assert call.id.startswith("call_")
    assert call.function.name in names, call
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, SCHEMAS[call.function.name])
    return arguments


def test_required_gives_a_valid_call_on_every_prompt(smol):
    client = smol_client(smol)
    for p in PROMPTS:
        choice = ask(client, p, tools=TOOLS, tool_choice="required",
                     parallel_tool_calls=False).choices[0]
        assert choice.finish_reason == "tool_calls", choice
        assert choice.message.content is None
        assert len(choice.message.tool_calls) == 1
        check_call(choice.message.tool_calls[0])


def test_required_with_parallel_calls_gives_valid_calls(smol):
    choice = ask(smol_client(smol), PROMPTS[0], tools=TOOLS, tool_choice="required",
                 max_tokens=80).choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert len(choice.message.tool_calls) >= 1
    for call in choice.message.tool_calls:
        check_call(call)
    ids = [c.id for c in choice.message.tool_calls]
    assert len(set(ids)) == len(ids)


def test_a_named_function_is_called_with_valid_arguments_on_every_prompt(smol):
    client = smol_client(smol)
    for p in PROMPTS:
        choice = ask(client, p, tools=TOOLS, tool_choice=NAMED).choices[0]
        assert choice.finish_reason == "tool_calls", choice
        assert choice.message.content is None
        (call,) = choice.message.tool_calls
        assert call.function.name == "get_weather"
        check_call(call)


def reassemble(stream):
    """The calls and content of a streamed reply, from its deltas, and its finish reason."""
    calls, content, finish = {}, "", None
    for chunk in stream:
        for c in chunk.choices:
            content += c.delta.content or ""
            for d in c.delta.tool_calls or []:
                call = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
                if d.id:
                    assert call["id"] is None, "the id comes once, first"
                    call["id"] = d.id
                if d.function and d.function.name:
                    call["name"] = d.function.name
                if d.function and d.function.arguments:
                    assert call["name"], "the name comes before the arguments"
                    call["arguments"] += d.function.arguments
            finish = c.finish_reason or finish
    return [calls[i] for i in sorted(calls)], content, finish


@pytest.mark.parametrize("tool_choice", ["required", NAMED])
def test_streamed_tool_call_deltas_reassemble_to_the_whole_reply(smol, tool_choice):
    client = smol_client(smol)
    whole = ask(client, PROMPTS[1], tools=TOOLS, tool_choice=tool_choice,
                parallel_tool_calls=False).choices[0]
    calls, content, finish = reassemble(
        ask(client, PROMPTS[1], tools=TOOLS, tool_choice=tool_choice,
            parallel_tool_calls=False, stream=True))
    assert finish == "tool_calls"
    assert content == ""
    assert [(c["name"], c["arguments"]) for c in calls] == [
        (c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    assert all(c["id"].startswith("call_") for c in calls)


def test_a_call_round_trips_through_a_second_turn(smol):
    client = smol_client(smol)
    first_messages = [{"role": "user", "content": PROMPTS[0]}]
    first = ask(client, None, messages=first_messages, tools=TOOLS, tool_choice=NAMED)
    call = first.choices[0].message.tool_calls[0]
    result = json.dumps({"temperature": 21, "sky": "clear"})
    messages = first_messages + [
        {"role": "assistant", "content": None,
         "tool_calls": [call.model_dump(exclude_none=True)]},
        {"role": "tool", "tool_call_id": call.id, "content": result},
    ]
    second = ask(client, None, messages=messages, tools=TOOLS, tool_choice="none")
    choice = second.choices[0]
    assert choice.finish_reason in ("stop", "length")
    assert choice.message.tool_calls is None
    assert isinstance(choice.message.content, str) and choice.message.content
    assert second.usage.prompt_tokens > first.usage.prompt_tokens
    # The tool's answer is in the prompt the second turn was generated from.
    ids = post(smol, "/tokenize", {"messages": messages}, headers={}).json()["tokens"]
    assert len(ids) == second.usage.prompt_tokens
    prompt = post(smol, "/detokenize", {"tokens": ids}, headers={}).json()["prompt"]
    assert result in prompt


def test_none_leaves_the_reply_free(smol):
    # SmolLM2's template ignores `tools`, so `none` must give exactly the reply without tools.
    client = smol_client(smol)
    with_tools = ask(client, PROMPTS[0], tools=TOOLS, tool_choice="none", max_tokens=24).choices[0]
    without = ask(client, PROMPTS[0], max_tokens=24).choices[0]
    assert with_tools.message.tool_calls is None
    assert with_tools.message.content == without.message.content
    assert with_tools.finish_reason == without.finish_reason


CHAT = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 4}


def test_auto_is_refused_without_a_parser_and_says_what_to_pass(tiny):
    for body in [{**CHAT, "tools": TOOLS}, {**CHAT, "tools": TOOLS, "tool_choice": "auto"}]:
        r = post(tiny, "/v1/chat/completions", body)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "tool_choice"
        assert "--tool-call-parser" in error["message"]


@pytest.fixture(scope="module")
def hermes(tiny_artifact):
    server = Server(tiny_artifact, "tiny", "--tool-call-parser", "hermes")
    yield server
    assert server.stop() == 0, server.log_text()


# Qwen2.5's template asks for `<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>`; the
# grammar makes the tiny model's reply take that form.
HERMES_GRAMMAR = (
    'start: "Checking. <tool_call>\\n{\\"name\\": \\"get_weather\\", \\"arguments\\": '
    '{\\"city\\": \\"" CITY "\\", \\"unit\\": \\"celsius\\"}}\\n</tool_call>"\n'
    'CITY: /[A-Z][a-z]{2,8}/')


def test_auto_reads_hermes_calls_and_leaves_other_text_as_content(hermes):
    client = openai.OpenAI(base_url=f"{hermes.url}/v1", api_key="unused", max_retries=0)
    kw = dict(model="tiny", tools=TOOLS, max_tokens=60,
              extra_body={"structured_outputs": {"grammar": HERMES_GRAMMAR}})
    choice = ask(client, PROMPTS[0], **kw).choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content == "Checking. "
    (call,) = choice.message.tool_calls
    assert check_call(call)["unit"] == "celsius"
    calls, content, finish = reassemble(ask(client, PROMPTS[0], stream=True, **kw))
    assert finish == "tool_calls"
    assert content == "Checking. "
    assert [(c["name"], c["arguments"]) for c in calls] == [
        (call.function.name, call.function.arguments)]
    # Free text (the tiny model's is not a call) stays content.
    free = ask(client, PROMPTS[0], model="tiny", tools=TOOLS, max_tokens=12).choices[0]
    assert free.message.tool_calls is None
    assert free.finish_reason == "length"
    assert free.message.content


def with_messages(*messages, **fields):
    return {"messages": list(messages), "max_tokens": 4, **fields}


USER = {"role": "user", "content": "x"}
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


@pytest.mark.parametrize("body,param", [
    ({**CHAT, "tools": [{"type": "web_search"}], "tool_choice": "required"}, "tools[0].type"),
    ({**CHAT, "tools": [{"type": "function"}], "tool_choice": "required"}, "tools[0].function"),
    ({**CHAT, "tools": [{"type": "function", "function": {"name": "get weather"}}],
      "tool_choice": "required"}, "tools[0].function.name"),
    ({**CHAT, "tools": [TOOLS[0], TOOLS[0]], "tool_choice": "required"},
     "tools[1].function.name"),
    ({**CHAT, "tools": [], "tool_choice": "required"}, "tools"),
    ({**CHAT, "tool_choice": "required"}, "tool_choice"),
    ({**CHAT, "tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({**CHAT, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name"),
    ({**CHAT, "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "nonsense"}}}}}],
      "tool_choice": "required"}, "tools[0].function.parameters"),
    ({**CHAT, "tools": [{"type": "function", "function": {"name": "f", "parameters": "a"}}],
      "tool_choice": "required"}, "tools[0].function.parameters"),
    ({**CHAT, "tools": TOOLS, "tool_choice": "required",
      "response_format": {"type": "json_object"}}, "tool_choice"),
    (with_messages(USER, {"role": "tool", "content": "21"}), "messages[1].tool_call_id"),
    (with_messages(USER, {"role": "assistant", "tool_calls": [
        {**CALL, "function": {"name": "get_weather", "arguments": "{not json"}}]}),
     "messages[1].tool_calls[0].function.arguments"),
    (with_messages({**USER, "tool_calls": [CALL]}), "messages[0].tool_calls"),
])
def test_tool_refusals_are_400_naming_the_field(tiny, body, param):
    r = post(tiny, "/v1/chat/completions", body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param, error
    assert error["message"]
