"""LangChain and LiteLLM against a real pystub serving the example models (tests/openai_backend.py's
agent backend): LangChain's ChatOpenAI (invoke, stream, async), `bind_tools` and an agent loop that
runs the tools until the model answers, `with_structured_output` in its three methods, and
OpenAIEmbeddings with `dimensions`; LiteLLM with `openai/` models (chat whole and streamed, tools,
response_format, text completion, embeddings). Nothing here reaches the internet: LiteLLM is told to
use its bundled model map."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from harness import Backend
from openai_backend import API_KEY, agent_backend, client
from pydantic import BaseModel, Field

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # else it fetches the map from GitHub on import
os.environ.setdefault("LITELLM_TELEMETRY", "False")


class Person(BaseModel):
    """A person the message names."""

    name: str = Field(description="their name")
    age: int = Field(description="their age in years")


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    with agent_backend(tmp_path_factory.mktemp("openai-frameworks")) as found:
        yield found


@pytest.fixture()
def http() -> Iterator[httpx.Client]:
    """The connections a framework's client uses, closed after the test (their defaults are cached
    for the life of the process, so the leak checks would see their sockets)."""
    with httpx.Client(timeout=60) as found:
        yield found


@pytest.fixture()
def oai(backend: Backend) -> Iterator[openai.OpenAI]:
    with client(backend) as found:
        yield found


def chat(backend: Backend, http: httpx.Client | None = None, model: str = "tool_llm", **kwargs: Any) -> Any:
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(model=model, base_url=backend.openai_url, api_key=API_KEY, max_retries=0,  # type: ignore[arg-type]
                      timeout=60, http_client=http, **kwargs)


# -- LangChain ------------------------------------------------------------------------------------------------
def test_langchain_invoke_stream_and_async(backend: Backend, http: httpx.Client) -> None:
    llm = chat(backend, http)
    assert llm.invoke("hello there").content == "You said: hello there"
    chunks = list(llm.stream("hello there"))
    assert len(chunks) > 2 and "".join(str(chunk.content) for chunk in chunks) == "You said: hello there"
    usage = chat(backend, http, stream_usage=True).invoke("count me").usage_metadata
    assert usage is not None and usage["output_tokens"] > 0
    assert llm.invoke("hello there", stop=["ere"]).content == "You said: hello th"  # the server enforces stop
    assert "".join(str(chunk.content) for chunk in llm.stream("hello there", stop=["ere"])) == "You said: hello th"

    async def in_a_loop() -> Any:
        async with httpx.AsyncClient(timeout=60) as connections:
            return await chat(backend, http_async_client=connections).ainvoke("async hi")

    assert asyncio.run(in_a_loop()).content == "You said: async hi"


def _tools() -> list[Any]:
    from langchain_core.tools import tool

    @tool
    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    return [multiply, get_weather]


def test_langchain_bind_tools_whole_and_streamed(backend: Backend, http: httpx.Client) -> None:
    llm = chat(backend, http).bind_tools(_tools())
    message = llm.invoke("Please multiply 6 by 7, and the weather in Paris")
    assert [(call["name"], call["args"]) for call in message.tool_calls] == [
        ("multiply", {"a": 6, "b": 7}), ("get_weather", {"city": "Paris"})]
    assert all(call["id"] for call in message.tool_calls)
    merged = None
    for chunk in llm.stream("Please multiply 6 by 7"):
        merged = chunk if merged is None else merged + chunk
    assert merged is not None
    assert [(c["name"], c["args"]) for c in merged.tool_calls] == [("multiply", {"a": 6, "b": 7})]
    assert len(merged.tool_call_chunks) == 1 and merged.response_metadata["finish_reason"] == "tool_calls"


def test_langchain_agent_loop_runs_the_tools_until_the_answer(backend: Backend, http: httpx.Client) -> None:
    from langchain_core.messages import HumanMessage, ToolMessage

    tools = {tool.name: tool for tool in _tools()}
    llm = chat(backend, http).bind_tools(list(tools.values()))
    messages: list[Any] = [HumanMessage("Please multiply 6 by 7")]
    for _ in range(4):  # a bound on the loop: the model answers on the second turn
        reply = llm.invoke(messages)
        messages.append(reply)
        if not reply.tool_calls:
            break
        for call in reply.tool_calls:
            messages.append(ToolMessage(str(tools[call["name"]].invoke(call["args"])), tool_call_id=call["id"]))
    assert [type(m).__name__ for m in messages] == ["HumanMessage", "AIMessage", "ToolMessage", "AIMessage"]
    assert messages[-1].content == "Here is what the tools returned: 42."


@pytest.mark.parametrize("method", ["function_calling", "json_schema", "json_mode"])
def test_langchain_with_structured_output(backend: Backend, http: httpx.Client, method: str) -> None:
    llm = chat(backend, http).with_structured_output(Person, method=method)
    # json_mode gives the model no schema (the prompt must say what to write): the stand-in writes
    # the keys the message names in backticks
    assert llm.invoke("My friend Anna is 31. Answer in JSON with `name` and `age`.") == Person(name="Anna", age=31)
    raw = chat(backend, http).with_structured_output(Person, method=method, include_raw=True).invoke(
        "My friend Bo is 7. Answer in JSON with `name` and `age`.")
    assert raw["parsed"] == Person(name="Bo", age=7) and raw["parsing_error"] is None


def test_langchain_json_mode_without_a_schema_gives_the_json(backend: Backend, http: httpx.Client) -> None:
    llm = chat(backend, http).with_structured_output(None, method="json_mode")
    assert llm.invoke("Answer with `name` and `city`: my friend Anna lives in Oslo") == {"name": "Anna", "city": "Oslo"}


def test_langchain_embeddings_with_dimensions(backend: Backend, http: httpx.Client) -> None:
    from langchain_openai import OpenAIEmbeddings

    def embedder(model: str, **kwargs: Any) -> Any:
        return OpenAIEmbeddings(model=model, base_url=backend.openai_url, api_key=API_KEY,  # type: ignore[arg-type]
                                check_embedding_ctx_length=False, max_retries=0, http_client=http,
                                **kwargs)  # no length check: it would fetch tiktoken's vocabulary

    vectors = embedder("word_embedding").embed_documents(["a b", "c"])
    assert [len(vector) for vector in vectors] == [8, 8]
    assert len(embedder("matryoshka_embedding", dimensions=4).embed_query("a b c")) == 4


# -- LiteLLM ----------------------------------------------------------------------------------------------------
def _litellm() -> Any:
    import litellm

    return litellm


def test_litellm_chat_whole_streamed_and_text_completion(backend: Backend, oai: openai.OpenAI) -> None:
    litellm = _litellm()
    common = {"api_base": backend.openai_url, "api_key": API_KEY, "num_retries": 0, "timeout": 60, "client": oai}
    reply = litellm.completion(model="openai/tool_llm", messages=[{"role": "user", "content": "hi"}], **common)
    assert reply.choices[0].message.content == "You said: hi" and reply.usage.total_tokens > 0
    stream = litellm.completion(model="openai/tool_llm", messages=[{"role": "user", "content": "hi"}], stream=True,
                                **common)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in stream) == "You said: hi"
    text = litellm.text_completion(model="openai/tool_llm", prompt="one two", **common)
    assert text.choices[0].text == "You said: one two"
    several = litellm.completion(model="openai/tool_llm", messages=[{"role": "user", "content": "hi"}], n=2,
                                 stop=["d: "], **common)
    assert [(c.index, c.message.content, c.finish_reason) for c in several.choices] == \
        [(0, "You sai", "stop"), (1, "You sai", "stop")]
    vectors = litellm.embedding(model="openai/word_embedding", input=["a b", "c"], **common)
    assert [len(item["embedding"]) for item in vectors.data] == [8, 8]


def test_litellm_tools_and_response_format(backend: Backend, oai: openai.OpenAI) -> None:
    litellm = _litellm()
    common = {"api_base": backend.openai_url, "api_key": API_KEY, "num_retries": 0, "timeout": 60, "client": oai}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    reply = litellm.completion(model="openai/tool_llm", messages=[{"role": "user", "content": "weather in Rome?"}],
                               tools=tools, **common)
    call = reply.choices[0].message.tool_calls[0]
    assert (call.function.name, call.function.arguments, reply.choices[0].finish_reason) == \
        ("get_weather", '{"city": "Rome"}', "tool_calls")
    asked = [{"role": "user", "content": "weather in Rome?"}]
    chunks = list(litellm.completion(model="openai/tool_llm", messages=asked, tools=tools, stream=True, **common))
    rebuilt = litellm.stream_chunk_builder(chunks)
    assert rebuilt.choices[0].message.tool_calls[0].function.arguments == '{"city": "Rome"}'
    formatted = litellm.completion(model="openai/tool_llm", response_format=Person, **common,
                                   messages=[{"role": "user", "content": "My friend Anna is 31"}])
    assert Person.model_validate_json(formatted.choices[0].message.content) == Person(name="Anna", age=31)
