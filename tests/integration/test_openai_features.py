"""What LLM applications send beyond plain chat, with the `openai` client and raw httpx against the
example models (tests/openai_backend.py's agent backend): structured output (response_format,
vLLM's guided_* and structured_outputs, refused for a model that does not declare it), `stop`
enforced by the server, `n` choices and list prompts, logprobs, the context length, token counts
from a tokenizer the test built, token-id prompts, embeddings `dimensions`, CORS, the API key's
401, `"usage": null` on a stream's chunks and trailing slashes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import requests
from harness import Backend
from openai.types.chat import ChatCompletionChunk
from openai_backend import API_KEY, CONTEXT_FLAG, ORIGIN, agent_backend, client, raw
from tokenizers import Tokenizer


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    with agent_backend(tmp_path_factory.mktemp("openai-features")) as found:
        yield found


@pytest.fixture()
def oai(backend: Backend) -> Iterator[openai.OpenAI]:
    with client(backend) as found:
        yield found


def user(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


def sse(backend: Backend, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with raw(backend) as http, http.stream("POST", path, json=body) as response:
        assert response.status_code == 200, response.read()
        data = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(item) for item in data[:-1]]


def model_stats(backend: Backend, model: str) -> dict[str, Any]:
    reply = requests.get(f"http://{backend.http_url}/v2/models/{model}/stats", timeout=30)
    return reply.json()["model_stats"][0]["inference_stats"]


# -- structured output --------------------------------------------------------------------------------
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "likes": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "age", "likes"]}


def test_response_format_json_schema_and_json_object(oai: openai.OpenAI) -> None:
    import jsonschema

    reply = oai.chat.completions.create(model="tool_llm", messages=user("My friend Anna is 31 and likes Rome"),
                                        response_format={"type": "json_schema",
                                                         "json_schema": {"name": "person", "schema": PERSON}})
    document = json.loads(reply.choices[0].message.content or "")
    jsonschema.validate(document, PERSON)  # the model followed the schema it was given
    assert document == {"name": "Anna", "age": 31, "likes": ["Rome"]}
    reply = oai.chat.completions.create(model="tool_llm", messages=user("Give `name` and `city`: Ann lives in Oslo"),
                                        response_format={"type": "json_object"})
    assert json.loads(reply.choices[0].message.content or "") == {"name": "Ann", "city": "Oslo"}


def test_vllm_guided_fields_and_structured_outputs(oai: openai.OpenAI) -> None:
    def ask(**extra: Any) -> str:
        return oai.chat.completions.create(model="tool_llm", messages=user("Is it yes or no? no"),
                                           extra_body=extra).choices[0].message.content or ""

    assert ask(guided_choice=["yes", "no"]) == "yes"  # the first choice the message names
    assert ask(guided_regex=r"[A-Z]{3}-\d{2}") == "AAA-00"
    assert json.loads(ask(guided_json=PERSON))["age"] == 1  # no number in the message: the fallback
    assert ask(structured_outputs={"choice": ["maybe", "no"]}) == "no"


def test_structured_output_for_a_model_that_does_not_declare_it_is_a_400(oai: openai.OpenAI) -> None:
    for extra in ({"response_format": {"type": "json_object"}}, {"extra_body": {"guided_regex": "a+"}}):
        with pytest.raises(openai.BadRequestError, match="does not declare structured outputs") as caught:
            oai.chat.completions.create(model="echo_llm", messages=user("x"), **extra)  # type: ignore[arg-type]
        assert "structured_outputs" in caught.value.message and caught.value.code is None


def test_the_guide_reaches_the_model_as_vllm_s_guided_decoding(oai: openai.OpenAI) -> None:
    """tool_llm writes its guided text only when `guided_decoding` (vLLM's name, JSON text of
    GuidedDecodingParams) reached its sampling parameters; a grammar, which it cannot follow,
    comes back as the model's own error."""
    with pytest.raises(openai.InternalServerError, match=r"cannot follow guided decoding of \['grammar'\]"):
        oai.chat.completions.create(model="tool_llm", messages=user("x"), extra_body={"guided_grammar": "root ::= x"})


# -- stop -----------------------------------------------------------------------------------------------
def test_stop_is_enforced_whole_and_streamed(backend: Backend, oai: openai.OpenAI) -> None:
    message = user("alpha beta gamma delta epsilon")  # the model ignores stop; it streams 4-character pieces
    whole = oai.chat.completions.create(model="tool_llm", messages=message, stop=["mma d", "zzz"])
    assert (whole.choices[0].message.content, whole.choices[0].finish_reason) == ("You said: alpha beta ga", "stop")
    documents = sse(backend, "/chat/completions", {"model": "tool_llm", "messages": message, "stop": "mma d",
                                                   "stream": True})
    pieces = [d["choices"][0]["delta"].get("content", "") for d in documents]
    assert "".join(pieces) == "You said: alpha beta ga" and documents[-1]["choices"][0]["finish_reason"] == "stop"
    assert " ga" in pieces and " gamm" not in pieces  # the model's " gamm": "mm" held back until "a d" decided it
    kept = oai.completions.create(model="tool_llm", prompt="one two three", stop=["two"],
                                  extra_body={"include_stop_str_in_output": True})
    assert kept.choices[0].text == "You said: one two"


# -- n, list prompts, logprobs ----------------------------------------------------------------------------
def test_n_choices_and_list_prompts(backend: Backend, oai: openai.OpenAI) -> None:
    one = oai.completions.create(model="tool_llm", prompt="hello there")
    three = oai.completions.create(model="tool_llm", prompt="hello there", n=3)
    assert [c.index for c in three.choices] == [0, 1, 2] and {c.text for c in three.choices} == {one.choices[0].text}
    assert one.usage is not None and three.usage is not None
    assert three.usage.completion_tokens == 3 * one.usage.completion_tokens  # each choice's tokens
    assert three.usage.prompt_tokens == one.usage.prompt_tokens  # the prompt once, as OpenAI counts it
    listed = oai.completions.create(model="tool_llm", prompt=["the fox", "the dog"], n=2)
    assert [(c.index, c.text) for c in listed.choices] == [(0, "You said: the fox"), (1, "You said: the fox"),
                                                           (2, "You said: the dog"), (3, "You said: the dog")]
    documents = sse(backend, "/chat/completions", {"model": "tool_llm", "messages": user("hi"), "n": 2,
                                                   "stream": True})
    texts = {0: "", 1: ""}
    for document in documents:
        choice = ChatCompletionChunk.model_validate(document).choices[0]
        texts[choice.index] += choice.delta.content or ""
    assert texts == {0: "You said: hi", 1: "You said: hi"}
    assert [d["choices"][0]["finish_reason"] for d in documents].count("stop") == 2


def test_logprobs_whole_and_streamed(backend: Backend, oai: openai.OpenAI) -> None:
    reply = oai.chat.completions.create(model="tool_llm", messages=user("hello there"), logprobs=True, top_logprobs=2)
    content = reply.choices[0].logprobs and reply.choices[0].logprobs.content
    assert content and "".join(t.token for t in content) == reply.choices[0].message.content
    assert all(len(t.top_logprobs) == 2 and t.top_logprobs[0].token == t.token and t.bytes == list(t.token.encode())
               for t in content)
    documents = sse(backend, "/chat/completions", {"model": "tool_llm", "messages": user("hello there"),
                                                   "logprobs": True, "stream": True, "stop": "there"})
    streamed = [t for d in documents if d["choices"][0]["logprobs"] for t in d["choices"][0]["logprobs"]["content"]]
    assert "".join(t["token"] for t in streamed) == "You said: hello"  # none past the stop string (" ther" crosses it)
    legacy = oai.completions.create(model="tool_llm", prompt="a b", logprobs=1).choices[0].logprobs
    assert legacy is not None and legacy.tokens and legacy.text_offset == [0, 3, 8, 9, 11]
    with pytest.raises(openai.BadRequestError, match="does not return logprobs"):
        oai.chat.completions.create(model="echo_llm", messages=user("x"), logprobs=True)


# -- context length, token counts ---------------------------------------------------------------------------
def test_context_length_is_checked_before_the_model_runs(backend: Backend, oai: openai.OpenAI) -> None:
    before = model_stats(backend, "echo_llm")["success"]["count"]
    with pytest.raises(openai.BadRequestError) as caught:
        oai.completions.create(model="echo_llm", prompt="word " * CONTEXT_FLAG, max_tokens=5)
    assert caught.value.code == "context_length_exceeded" and f"maximum context length is {CONTEXT_FLAG}" in \
        caught.value.message and caught.value.body["param"] == "prompt"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError, match="context_length_exceeded|maximum context length is 8192"):
        oai.chat.completions.create(model="tool_llm", messages=user("word " * 8200))  # its config's max_model_len
    assert oai.completions.create(model="tool_llm", prompt="word " * 1000).choices[0].text  # within 8192
    assert model_stats(backend, "echo_llm")["success"]["count"] == before  # refused before the model ran


def test_usage_counts_tokens_of_the_tokenizer(backend: Backend, oai: openai.OpenAI) -> None:
    tokenizer = Tokenizer.from_file(str(Path(backend.repository).parent / "tokenizer" / "tokenizer.json"))
    completion = oai.completions.create(model="echo_llm", prompt="hello there, quick fox")
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == 6  # <s> hello there , quick fox: not 4 words
    assert completion.usage.completion_tokens == len(tokenizer.encode("hello there, quick fox",
                                                                      add_special_tokens=False).ids)
    chat = oai.chat.completions.create(model="echo_llm", messages=user("hi"))
    assert chat.usage is not None and chat.usage.prompt_tokens == len(tokenizer.encode(
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False).ids) == 6
    ids = tokenizer.encode("the quick fox", add_special_tokens=False).ids
    assert oai.completions.create(model="echo_llm", prompt=ids).choices[0].text == "the quick fox"
    with pytest.raises(openai.BadRequestError, match="not in the tokenizer's vocabulary"):
        oai.completions.create(model="echo_llm", prompt=[10**6])


# -- embeddings ---------------------------------------------------------------------------------------------
def test_embeddings_dimensions(oai: openai.OpenAI) -> None:
    full = oai.embeddings.create(model="matryoshka_embedding", input="a b c d").data[0].embedding
    same = oai.embeddings.create(model="word_embedding", input="a b c d", dimensions=8).data[0].embedding
    assert len(full) == 8 and same == full
    short = np.array(oai.embeddings.create(model="matryoshka_embedding", input="a b c d", dimensions=3)
                     .data[0].embedding)
    head = np.array(full[:3])
    assert np.isclose(np.linalg.norm(short), 1.0) and np.allclose(short, head / np.linalg.norm(head), atol=1e-6)
    with pytest.raises(openai.BadRequestError, match="matryoshka"):
        oai.embeddings.create(model="word_embedding", input="a", dimensions=4)
    with pytest.raises(openai.BadRequestError, match="exceeds"):
        oai.embeddings.create(model="matryoshka_embedding", input="a", dimensions=9)


# -- the smaller items ------------------------------------------------------------------------------------------
def test_cors_for_the_allowed_origin(backend: Backend) -> None:
    preflight = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"}
    answer = httpx.options(f"{backend.openai_url}/chat/completions", headers=preflight)  # no key on a preflight
    assert answer.status_code == 204
    assert answer.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in answer.headers["access-control-allow-methods"]
    assert answer.headers["access-control-allow-headers"] == "authorization, content-type"
    other = httpx.options(f"{backend.openai_url}/chat/completions", headers={**preflight, "Origin": "https://evil"})
    assert other.status_code == 403 and "access-control-allow-origin" not in other.headers
    headers = {"Origin": ORIGIN, "Authorization": f"Bearer {API_KEY}"}
    listed = httpx.get(f"{backend.openai_url}/models", headers=headers)
    assert listed.headers["access-control-allow-origin"] == ORIGIN and listed.headers["vary"] == "Origin"
    with httpx.stream("POST", f"{backend.openai_url}/completions", headers=headers,
                      json={"model": "tool_llm", "prompt": "x", "stream": True}) as streamed:
        assert streamed.headers["access-control-allow-origin"] == ORIGIN
        streamed.read()
    refused = httpx.get(f"{backend.openai_url}/models", headers={"Origin": ORIGIN})  # no key: 401, still readable
    assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == ORIGIN


def test_a_missing_or_wrong_key_is_401(backend: Backend) -> None:
    with openai.OpenAI(base_url=backend.openai_url, api_key="wrong", max_retries=0, timeout=30) as other, \
            pytest.raises(openai.AuthenticationError) as caught:
        other.models.list()
    assert caught.value.status_code == 401 and caught.value.code == "invalid_api_key"
    missing = httpx.post(f"{backend.openai_url}/chat/completions", json={"model": "tool_llm", "messages": user("x")})
    error = missing.json()["error"]
    assert missing.status_code == 401 and (error["type"], error["code"]) == ("invalid_request_error", "invalid_api_key")


def test_usage_null_on_every_chunk_before_the_last_and_trailing_slashes(backend: Backend) -> None:
    documents = sse(backend, "/chat/completions", {"model": "tool_llm", "messages": user("a b"), "stream": True,
                                                   "stream_options": {"include_usage": True}})
    assert all("usage" in d and d["usage"] is None for d in documents[:-1])
    assert documents[-1]["usage"]["total_tokens"] > 0 and documents[-1]["choices"] == []
    plain = sse(backend, "/chat/completions", {"model": "tool_llm", "messages": user("a b"), "stream": True})
    assert all("usage" not in d for d in plain)
    with raw(backend) as http:
        assert http.get("/models/").status_code == 200
        assert http.get("/models/tool_llm/").json()["id"] == "tool_llm"
        assert http.post("/completions/", json={"model": "tool_llm", "prompt": "x"}).status_code == 200
        unknown = http.post("/chat/completions", json={"model": "nope", "messages": user("x")})
        assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "invalid_request_error"
        assert unknown.json()["error"]["code"] == "model_not_found"
