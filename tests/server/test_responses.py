"""The Responses API (`/v1/responses`, stateless) through the real OpenAI client's
`client.responses`: text input with instructions giving what the chat endpoint gives for the same
conversation, the streamed event sequence, function tools enforced with `tool_choice` and a call
answered in a second turn, and the stored-state fields refused by name."""

import json

import jsonschema
import openai
import pytest

from test_server import post
from test_tools import TOOLS, WEATHER

FLAT_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]
INSTRUCTIONS = "You answer in one short sentence."
QUESTION = "What is the capital of France?"


def smol_client(smol) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{smol.url}/v1", api_key="unused", max_retries=0)


def test_text_input_gives_what_chat_gives_for_the_same_conversation(smol):
    client = smol_client(smol)
    r = client.responses.create(model="smol", input=QUESTION, instructions=INSTRUCTIONS,
                                max_output_tokens=24, temperature=0)
    chat = client.chat.completions.create(
        model="smol", max_tokens=24, temperature=0,
        messages=[{"role": "system", "content": INSTRUCTIONS},
                  {"role": "user", "content": QUESTION}])
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.output_text == chat.choices[0].message.content
    expected = {"stop": "completed", "length": "incomplete"}[chat.choices[0].finish_reason]
    assert r.status == expected
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.usage.output_tokens == chat.usage.completion_tokens
    (item,) = r.output
    assert item.type == "message" and item.role == "assistant"


def test_streamed_events_follow_the_responses_sequence(smol):
    client = smol_client(smol)
    kw = dict(model="smol", input=QUESTION, max_output_tokens=16, temperature=0)
    whole = client.responses.create(**kw)
    events = list(client.responses.create(stream=True, **kw))
    types = [e.type for e in events]
    assert types[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert deltas and types[4:4 + len(deltas)] == ["response.output_text.delta"] * len(deltas)
    assert types[4 + len(deltas):] == [
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed" if whole.status == "completed" else "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(d.delta for d in deltas)
    assert text == whole.output_text
    assert events[-1].response.output_text == text


def test_a_required_function_call_and_its_answer_in_a_second_turn(smol):
    client = smol_client(smol)
    question = [{"role": "user", "content": "What is the weather like in Paris?"}]
    r = client.responses.create(model="smol", input=question, tools=FLAT_TOOLS,
                                tool_choice={"type": "function", "name": "get_weather"},
                                max_output_tokens=40, temperature=0)
    (call,) = r.output
    assert call.type == "function_call" and call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    second = client.responses.create(
        model="smol", tools=FLAT_TOOLS, tool_choice="none", max_output_tokens=16, temperature=0,
        input=question + [
            {"type": "function_call", "call_id": call.call_id, "name": call.name,
             "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id,
             "output": json.dumps({"temperature": 21})}])
    assert second.output[0].type == "message"
    assert second.output_text
    assert second.usage.input_tokens > r.usage.input_tokens


def test_a_streamed_call_reassembles_to_the_whole_one(smol):
    client = smol_client(smol)
    kw = dict(model="smol", input="Is it raining in Tokyo?", tools=FLAT_TOOLS,
              tool_choice="required", parallel_tool_calls=False, max_output_tokens=40,
              temperature=0)
    (whole,) = client.responses.create(**kw).output
    events = list(client.responses.create(stream=True, **kw))
    arguments = "".join(e.delta for e in events
                        if e.type == "response.function_call_arguments.delta")
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [(d.type, d.name, d.arguments) for d in done] == [
        ("function_call", whole.name, whole.arguments)]
    assert arguments == whole.arguments
    assert events[-1].type == "response.completed"


@pytest.mark.parametrize("body,param", [
    ({"input": "x", "store": True}, "store"),
    ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": "x", "reasoning": {"effort": "low"}}, "reasoning"),
    ({}, "input"),
    ({"input": 5}, "input"),
    ({"input": [{"type": "image", "url": "x"}]}, "input[0].type"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "tools": [{"type": "web_search"}], "tool_choice": "required"},
     "tools[0].type"),
    ({"input": "x", "tools": FLAT_TOOLS, "tool_choice": {"type": "function", "name": "nope"}},
     "tool_choice.name"),
    ({"input": "x", "tools": FLAT_TOOLS}, "tool_choice"),
    ({"input": [{"role": "user", "content": "x"},
                {"type": "function_call_output", "output": "1"}]}, "input[1].call_id"),
])
def test_responses_refusals_are_400_naming_the_field(tiny, body, param):
    r = post(tiny, "/v1/responses", body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param, error
    assert error["message"]
