"""The OpenAI-compatible port with the official `openai` client and raw httpx: models, completions
and chat (whole and streamed, usage), embeddings (float and base64), cancellation by closing a
stream, and a hundred concurrent streams. Every body validates against the openai package's own
response types (tests/openai_backend.py has the server and its models)."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import requests
from harness import Backend
from openai.pagination import SyncPage
from openai.types import Completion, CreateEmbeddingResponse, Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai_backend import API_KEY, client, expected_embedding, openai_backend, raw
from otlp_collector import Collector

PROMPT = "the quick brown fox jumps"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Backend, Collector]]:
    with openai_backend(tmp_path_factory.mktemp("openai")) as found:
        yield found


@pytest.fixture()
def backend(served: tuple[Backend, Collector]) -> Backend:
    return served[0]


@pytest.fixture()
def oai(backend: Backend) -> Iterator[openai.OpenAI]:
    with client(backend) as found:
        yield found


def sse_documents(backend: Backend, path: str, body: dict[str, object]) -> list[dict[str, object]]:
    """The `data:` documents of a streamed answer, checked to end with [DONE]."""
    with raw(backend) as http, http.stream("POST", path, json=body) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        data = [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(item) for item in data[:-1]]


def completion_chunk(document: dict[str, object]) -> Completion:
    """A streamed completion chunk as openai.types.Completion. OpenAI's API (and vLLM, and Triton's
    frontend) send `finish_reason: null` before the last chunk, which the package's type does not
    allow (its stream parser builds chunks without validating): null is checked here, and the rest
    of the chunk validates against the type."""
    choices = document["choices"]
    assert isinstance(choices, list)
    for choice in choices:
        assert choice["finish_reason"] in (None, "stop", "length")
    return Completion.model_validate({**document, "choices": [
        {**choice, "finish_reason": choice["finish_reason"] or "stop"} for choice in choices]})


def test_models_list_and_one(backend: Backend, oai: openai.OpenAI) -> None:
    names = {model.id for model in oai.models.list()}
    assert {"openai_echo", "openai_echo_batched", "embedder", "add_sub"} <= names
    with raw(backend) as http:
        page = SyncPage[Model].model_validate(http.get("/models").json())
        assert {model.owned_by for model in page.data} == {"pystub"}
        assert Model.model_validate(http.get("/models/openai_echo").json()).id == "openai_echo"
    assert oai.models.retrieve("embedder").id == "embedder"


def test_completion_whole(backend: Backend, oai: openai.OpenAI) -> None:
    completion = oai.completions.create(model="openai_echo", prompt=PROMPT)
    assert completion.choices[0].text == PROMPT  # the model echoes its prompt: it arrived unchanged
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None and completion.usage.prompt_tokens == 5
    with raw(backend) as http:
        body = http.post("/completions", json={"model": "openai_echo", "prompt": PROMPT, "max_tokens": 2}).json()
    parsed = Completion.model_validate(body)
    assert parsed.choices[0].text == "the quick " and parsed.choices[0].finish_reason == "length"
    assert parsed.usage is not None and parsed.usage.completion_tokens == 2


def test_completion_echo_sends_exclude_input_false(oai: openai.OpenAI) -> None:
    text = oai.completions.create(model="openai_echo", prompt="a b", echo=True).choices[0].text
    assert text == "a ba b"  # vLLM's exclude_input_in_output=false: the prompt, then the generation


def test_completion_streamed_token_by_token_with_usage(backend: Backend, oai: openai.OpenAI) -> None:
    chunks = list(oai.completions.create(model="openai_echo", prompt=PROMPT, stream=True,
                                         stream_options={"include_usage": True}))
    texts = [chunk.choices[0].text for chunk in chunks if chunk.choices]
    assert texts == ["the ", "quick ", "brown ", "fox ", "jumps", ""]  # one chunk a token, then the finish
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 10
    documents = sse_documents(backend, "/completions", {"model": "openai_echo", "prompt": PROMPT, "stream": True})
    parsed = [completion_chunk(document) for document in documents]
    assert "".join(c.choices[0].text for c in parsed) == PROMPT
    assert [document["choices"][0]["finish_reason"] for document in documents] == [None] * 5 + ["stop"]
    assert all(c.usage is None for c in parsed)  # usage only when asked for
    assert len({c.id for c in parsed}) == 1


def test_sampling_parameters_and_flags_reach_the_model(oai: openai.OpenAI) -> None:
    text = oai.completions.create(model="openai_echo", prompt="<params>", max_tokens=7, temperature=0.5, top_p=0.9,
                                  seed=3).choices[0].text
    seen = json.loads(text)
    assert seen["sampling"] == {"temperature": 0.5, "top_p": 0.9, "seed": 3, "max_tokens": 7}
    cut = oai.completions.create(model="openai_echo", prompt="<params>", stop=["@@"]).choices[0].text
    assert cut.endswith('{"stop": ["')  # the stop string reached the model, and its echo of it was cut there
    assert seen["stream"] is False and seen["exclude"] is True and seen["prompt"] == "<params>"
    assert seen["max_tokens_input"] == 7  # the model declares an INT32 max_tokens input too
    odd = "<params>  héllo\n\twörld 🙂 \u0000 end  "
    assert json.loads(oai.completions.create(model="openai_echo", prompt=odd).choices[0].text)["prompt"] == odd


# vLLM's sampling fields beyond OpenAI's, with a value of the right type each
VLLM_EXTRAS = {"top_k": 40, "min_p": 0.05, "repetition_penalty": 1.2, "length_penalty": 0.9, "min_tokens": 2,
               "ignore_eos": True, "stop_token_ids": [2], "include_stop_str_in_output": False, "bad_words": ["x"],
               "allowed_token_ids": [1, 2], "logit_bias": {"7": -100}, "prompt_logprobs": 1, "detokenize": True,
               "skip_special_tokens": False, "spaces_between_special_tokens": True, "truncate_prompt_tokens": 64,
               "use_beam_search": False, "extra_args": {"a": [1]}}


def test_vllm_sampling_fields_reach_the_model_unchanged(oai: openai.OpenAI) -> None:
    for create in (oai.completions.create, oai.chat.completions.create):
        asked = {"prompt": "<params>"} if create == oai.completions.create else \
            {"messages": [{"role": "user", "content": "<params>"}]}
        text = create(model="openai_echo", **asked, extra_body={**VLLM_EXTRAS, "no_such_field": 1,  # type: ignore[operator]
                                                                 "metadata": {"k": "v"}})
        answer = text.choices[0].text if hasattr(text.choices[0], "text") else text.choices[0].message.content
        seen = json.loads(answer[answer.index("{"):answer.rindex("}") + 1])
        assert seen["sampling"] == VLLM_EXTRAS  # every field unchanged; the unknown ones ignored


def test_n_choices_are_n_requests_with_their_own_seed(oai: openai.OpenAI) -> None:
    reply = oai.completions.create(model="openai_echo", prompt="<params>", n=3, seed=7)
    seeds = [json.loads(choice.text)["sampling"]["seed"] for choice in reply.choices]
    assert [choice.index for choice in reply.choices] == [0, 1, 2] and seeds == [7, 8, 9]


def test_chat_usage_without_a_tokenizer_counts_the_messages_words(oai: openai.OpenAI) -> None:
    reply = oai.chat.completions.create(model="openai_echo", messages=[{"role": "system", "content": "be brief"},
                                                                       {"role": "user", "content": "one two three"}])
    assert reply.usage is not None and reply.usage.prompt_tokens == 5  # not the template's markers


def test_batched_model_dims_and_int32_max_tokens(oai: openai.OpenAI) -> None:
    seen = json.loads(oai.completions.create(model="openai_echo_batched", prompt="<params>", max_tokens=3)
                      .choices[0].text)
    assert seen["max_tokens_input"] == 3 and seen["sampling"] == {}  # no sampling_parameters input declared
    streamed = list(oai.completions.create(model="openai_echo_batched", prompt=PROMPT, max_tokens=3, stream=True,
                                           stream_options={"include_usage": True}))
    assert "".join(chunk.choices[0].text for chunk in streamed if chunk.choices) == "the quick brown "
    usage = streamed[-1].usage  # the model's own counts (its per-response deltas add up), not words
    assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (50, 3)
    whole = oai.completions.create(model="openai_echo_batched", prompt=PROMPT, max_tokens=3)
    assert whole.usage is not None and (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (50, 3)
    assert whole.choices[0].finish_reason == "length"


def test_chat_whole_renders_the_tokenizer_template(backend: Backend, oai: openai.OpenAI) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "<params>"}]
    reply = oai.chat.completions.create(model="openai_echo", messages=messages)  # type: ignore[arg-type]
    assert reply.choices[0].message.role == "assistant"
    seen = json.loads(reply.choices[0].message.content or "")
    assert seen["prompt"] == "<s>[system] be brief\n[user] <params>\n[assistant]"
    with raw(backend) as http:
        body = http.post("/chat/completions", json={"model": "openai_echo", "max_completion_tokens": 2,
                                                    "messages": [{"role": "user", "content": "hi there all"}]}).json()
    parsed = ChatCompletion.model_validate(body)
    assert parsed.choices[0].message.content == "<s>[user] hi "  # the first two words of the rendered prompt
    assert parsed.choices[0].finish_reason == "length"


def test_chat_streamed_with_usage(backend: Backend, oai: openai.OpenAI) -> None:
    body = {"model": "openai_echo", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi you"}]}],
            "stream": True, "stream_options": {"include_usage": True}}
    documents = sse_documents(backend, "/chat/completions", body)
    parsed = [ChatCompletionChunk.model_validate(document) for document in documents]
    assert parsed[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in parsed if c.choices) == "<s>[user] hi you\n[assistant]"
    assert parsed[-2].choices[0].finish_reason == "stop"
    assert parsed[-1].choices == [] and parsed[-1].usage is not None and parsed[-1].usage.completion_tokens == 4
    stream = oai.chat.completions.create(model="openai_echo", messages=[{"role": "user", "content": "x"}], stream=True)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in stream) == "<s>[user] x\n[assistant]"


@pytest.mark.parametrize("encoding", ["float", "base64"])
def test_embeddings(backend: Backend, oai: openai.OpenAI, encoding: str) -> None:
    texts = ["one", "two words", "three little words"]
    with raw(backend) as http:
        body = http.post("/embeddings", json={"model": "embedder", "input": texts, "encoding_format": encoding}).json()
    if encoding == "base64":  # the type holds lists of floats: the client decodes base64 before building it
        for item in body["data"]:
            assert isinstance(item["embedding"], str)
            item["embedding"] = np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4").tolist()
    parsed = CreateEmbeddingResponse.model_validate(body)
    assert [item.index for item in parsed.data] == [0, 1, 2] and parsed.model == "embedder"
    assert [item.embedding for item in parsed.data] == [expected_embedding(text) for text in texts]
    result = oai.embeddings.create(model="embedder", input=texts)  # the client asks for base64 and decodes it
    assert [item.embedding for item in result.data] == [expected_embedding(text) for text in texts]
    assert result.usage.prompt_tokens == 6


def test_closing_a_stream_cancels_the_request_in_the_model(backend: Backend, oai: openai.OpenAI) -> None:
    before = backend.log().count("openai_echo: cancelled after")
    stream = oai.completions.create(model="openai_echo", prompt="<delay=0.2> " + "word " * 200, stream=True)
    received = [next(stream).choices[0].text for _ in range(2)]
    stream.close()
    assert received == ["<delay=0.2> ", "word "]
    # The model prints this only when it sees is_cancelled(); uncancelled, it would run 40 s more.
    words = int(backend.wait_for_log(r"openai_echo: cancelled after (\d+) words", count=before + 1).group(1))
    assert 2 <= words < 201


def _counters(backend: Backend) -> dict[str, int]:
    text = requests.get(backend.metrics_url, timeout=30).text
    found = {"success": re.search(r'nv_inference_request_success\{model="openai_echo",version="1"\} (\d+)', text),
             "canceled": re.search(r'nv_inference_request_failure\{model="openai_echo",reason="CANCELED",'
                                   r'version="1"\} (\d+)', text)}
    return {name: int(match.group(1)) if match else 0 for name, match in found.items()}


def test_a_cancelled_stream_counts_as_canceled_not_success(backend: Backend, oai: openai.OpenAI) -> None:
    before = _counters(backend)
    stream = oai.completions.create(model="openai_echo", prompt="<delay=0.2> " + "word " * 200, stream=True)
    next(stream)
    stream.close()
    deadline = time.monotonic() + 60
    while _counters(backend)["canceled"] == before["canceled"]:
        assert time.monotonic() < deadline, f"no CANCELED failure counted for openai_echo within 60 s: {before}"
        time.sleep(0.1)
    after = _counters(backend)
    assert after == {"success": before["success"], "canceled": before["canceled"] + 1}


def test_a_hundred_concurrent_streams_lose_nothing(backend: Backend) -> None:
    async def one(client: openai.AsyncOpenAI, index: int) -> tuple[str, str]:
        prompt = f"stream {index} " + " ".join(f"w{index}.{k}" for k in range(20))
        stream = await client.completions.create(model="openai_echo", prompt=prompt, stream=True)
        return prompt, "".join([chunk.choices[0].text async for chunk in stream])

    async def all_of_them() -> list[tuple[str, str]]:
        limits = openai.DefaultAsyncHttpxClient(limits=httpx.Limits(max_connections=100))
        async with openai.AsyncOpenAI(base_url=backend.openai_url, api_key=API_KEY, max_retries=0, timeout=120,
                                      http_client=limits) as client:
            return await asyncio.gather(*(one(client, index) for index in range(100)))

    results = asyncio.run(all_of_them())
    assert len(results) == 100
    for prompt, text in results:
        assert text == prompt


def test_example_models_serve_the_openai_client() -> None:
    from harness import ROOT

    with Backend(ROOT / "examples" / "openai_models", "--openai-port", "0") as example, \
            openai.OpenAI(base_url=example.openai_url, api_key="none", max_retries=0, timeout=60) as plain:
        streamed = plain.completions.create(model="echo_llm", prompt="hello there", stream=True)
        assert "".join(chunk.choices[0].text for chunk in streamed) == "hello there"
        reply = plain.chat.completions.create(model="echo_llm", messages=[{"role": "user", "content": "hi"}])
        assert reply.choices[0].message.content == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        vectors = plain.embeddings.create(model="word_embedding", input=["a b", "c"]).data
        assert [len(item.embedding) for item in vectors] == [8, 8]
        tools: Any = [{"type": "function", "function": {"name": "get_weather", "parameters": {  # docs/openai.md's
            "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
        reply = plain.chat.completions.create(model="tool_llm", tools=tools,
                                              messages=[{"role": "user", "content": "The weather in Paris?"}])
        calls = reply.choices[0].message.tool_calls or []
        assert [(call.function.name, call.function.arguments) for call in calls] == [("get_weather",
                                                                                    '{"city": "Paris"}')]
