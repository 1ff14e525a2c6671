"""Tool calling on the OpenAI port with the official `openai` client, sync and async, whole and
streamed, against the example model tool_llm (examples/openai_models): calls parsed from its text
by the hermes, llama3 and mistral parsers (`delta.tool_calls` fragments with ids, finish_reason
"tool_calls"), tool_choice auto / none / required / named (the last two guided by a schema, as
the model declares structured outputs), parallel_tool_calls, and a conversation that feeds the
results back (tests/openai_backend.py has the server)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from harness import Backend
from openai.types.chat import ChatCompletionChunk
from openai_backend import API_KEY, agent_backend, client

TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                     "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "description": "The time in a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
]
BOTH = [{"role": "user", "content": "What is the weather in Paris and the time in Tokyo?"}]
EXPECTED = [("get_weather", {"city": "Paris"}), ("get_time", {"city": "Tokyo"})]


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    with agent_backend(tmp_path_factory.mktemp("openai-tools")) as found:
        yield found


@pytest.fixture()
def oai(backend: Backend) -> Iterator[openai.OpenAI]:
    with client(backend) as found:
        yield found


def calls_of(message: Any) -> list[tuple[str, dict[str, Any]]]:
    return [(call.function.name, json.loads(call.function.arguments)) for call in message.tool_calls or []]


def streamed_calls(chunks: list[ChatCompletionChunk]) -> tuple[str, list[dict[str, str]], str | None]:
    """The content, the calls (id, name, arguments joined from their fragments) and the finish
    reason of a stream, checking that each call's id and name come with its first fragment only."""
    content, calls, finish = "", {}, None
    for chunk in chunks:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
            for fragment in choice.delta.tool_calls or []:
                function = fragment.function
                assert function is not None
                if fragment.index not in calls:
                    assert fragment.id and function.name and fragment.type == "function", fragment
                    calls[fragment.index] = {"id": fragment.id, "name": function.name, "arguments": ""}
                else:
                    assert fragment.id is None and function.name is None, fragment
                calls[fragment.index]["arguments"] += function.arguments or ""
    return content, [calls[index] for index in sorted(calls)], finish


def test_auto_calls_whole_and_streamed(oai: openai.OpenAI) -> None:
    whole = oai.chat.completions.create(model="tool_llm", messages=BOTH, tools=TOOLS)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert calls_of(choice.message) == EXPECTED
    assert all(call.id.startswith("call_") for call in choice.message.tool_calls or [])
    chunks = list(oai.chat.completions.create(model="tool_llm", messages=BOTH, tools=TOOLS, stream=True))
    content, calls, finish = streamed_calls(chunks)
    assert (content, finish) == ("", "tool_calls")
    assert [(call["name"], json.loads(call["arguments"])) for call in calls] == EXPECTED
    fragments = sum(len(choice.delta.tool_calls or []) for chunk in chunks for choice in chunk.choices)
    assert fragments > len(calls)  # the arguments came in pieces, as the model wrote them


@pytest.mark.parametrize("model", ["tool_llm_llama3", "tool_llm_mistral"])
def test_llama3_and_mistral_calls(oai: openai.OpenAI, model: str) -> None:
    whole = oai.chat.completions.create(model=model, messages=BOTH, tools=TOOLS)
    assert calls_of(whole.choices[0].message) == EXPECTED and whole.choices[0].finish_reason == "tool_calls"
    content, calls, finish = streamed_calls(list(oai.chat.completions.create(model=model, messages=BOTH,
                                                                             tools=TOOLS, stream=True)))
    assert [(call["name"], json.loads(call["arguments"])) for call in calls] == EXPECTED and finish == "tool_calls"
    if model.endswith("mistral"):  # Mistral's templates take back only nine-character alphanumeric ids
        assert all(len(call["id"]) == 9 and call["id"].isalnum() for call in calls)


def test_parallel_tool_calls_false_keeps_the_first(oai: openai.OpenAI) -> None:
    whole = oai.chat.completions.create(model="tool_llm", messages=BOTH, tools=TOOLS, parallel_tool_calls=False)
    assert calls_of(whole.choices[0].message) == EXPECTED[:1]
    _, calls, _ = streamed_calls(list(oai.chat.completions.create(
        model="tool_llm", messages=BOTH, tools=TOOLS, parallel_tool_calls=False, stream=True)))
    assert [call["name"] for call in calls] == ["get_weather"]


def test_named_and_required_tool_choice_are_guided(oai: openai.OpenAI) -> None:
    named = oai.chat.completions.create(model="tool_llm", messages=BOTH, tools=TOOLS,
                                        tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert [name for name, _ in calls_of(named.choices[0].message)] == ["get_time"]
    _, calls, finish = streamed_calls(list(oai.chat.completions.create(
        model="tool_llm", messages=BOTH, tools=TOOLS, stream=True,
        tool_choice={"type": "function", "function": {"name": "get_time"}})))
    assert [call["name"] for call in calls] == ["get_time"] and finish == "tool_calls"
    assert json.loads(calls[0]["arguments"]) == calls_of(named.choices[0].message)[0][1]
    asked = [{"role": "user", "content": "Tell me a joke"}]  # names no tool: auto would answer in text
    assert oai.chat.completions.create(model="tool_llm", messages=asked, tools=TOOLS).choices[0].message.tool_calls \
        is None
    required = oai.chat.completions.create(model="tool_llm", messages=asked, tools=TOOLS, tool_choice="required")
    assert [name for name, _ in calls_of(required.choices[0].message)] == ["get_weather"]
    _, calls, _ = streamed_calls(list(oai.chat.completions.create(model="tool_llm", messages=BOTH, tools=TOOLS,
                                                                  tool_choice="required", stream=True)))
    assert [call["name"] for call in calls] == ["get_weather"]


def test_tool_choice_none_answers_in_text(oai: openai.OpenAI) -> None:
    reply = oai.chat.completions.create(model="tool_llm", messages=BOTH, tools=TOOLS, tool_choice="none")
    assert reply.choices[0].message.tool_calls is None and reply.choices[0].finish_reason == "stop"
    assert reply.choices[0].message.content == "You said: " + BOTH[0]["content"]


def test_a_conversation_with_the_results(oai: openai.OpenAI) -> None:
    """An agent's loop with the plain client: the calls, their results as tool messages, the answer."""
    messages: list[Any] = list(BOTH)
    first = oai.chat.completions.create(model="tool_llm", messages=messages, tools=TOOLS).choices[0].message
    results = {"get_weather": "sunny", "get_time": "09:00"}
    messages.append(first.model_dump(exclude_none=True))
    for call in first.tool_calls or []:
        messages.append({"role": "tool", "tool_call_id": call.id, "content": results[call.function.name]})
    final = oai.chat.completions.create(model="tool_llm", messages=messages, tools=TOOLS).choices[0]
    assert final.finish_reason == "stop" and final.message.tool_calls is None
    assert final.message.content == "Here is what the tools returned: sunny; 09:00."


def test_async_client_streams_calls(backend: Backend) -> None:
    async def run() -> list[tuple[str, list[dict[str, str]], str | None]]:
        async with openai.AsyncOpenAI(base_url=backend.openai_url, api_key=API_KEY, max_retries=0,
                                      timeout=60) as aclient:
            async def one() -> tuple[str, list[dict[str, str]], str | None]:
                stream = await aclient.chat.completions.create(model="tool_llm", messages=BOTH,  # type: ignore[arg-type]
                                                               tools=TOOLS, stream=True)
                return streamed_calls([chunk async for chunk in stream])
            whole = await aclient.chat.completions.create(model="tool_llm", messages=BOTH, tools=TOOLS)  # type: ignore[arg-type]
            assert calls_of(whole.choices[0].message) == EXPECTED
            return await asyncio.gather(*(one() for _ in range(8)))

    for _, calls, finish in asyncio.run(run()):
        assert [(call["name"], json.loads(call["arguments"])) for call in calls] == EXPECTED
        assert len({call["id"] for call in calls}) == 2 and finish == "tool_calls"


def test_tools_for_a_model_without_a_parser_are_a_400(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="--tool-call-parser") as caught:
        oai.chat.completions.create(model="echo_llm", messages=BOTH, tools=TOOLS)
    assert caught.value.body["param"] == "tools"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError, match="structured outputs"):
        oai.chat.completions.create(model="echo_llm", messages=BOTH, tools=TOOLS, tool_choice="required")
