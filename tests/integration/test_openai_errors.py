"""The OpenAI port's refusals (OpenAI's error body and status codes, as the `openai` client maps
them to its exceptions) and its operations: the restricted group, access lines, per-model metrics
with time to first token and inter-token latency, traces continued from `traceparent`."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import requests
from harness import Backend
from openai.types import ErrorObject
from openai_backend import client, openai_backend, raw
from otlp_collector import Collector


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Backend, Collector]]:
    with openai_backend(tmp_path_factory.mktemp("openai-errors")) as found:
        yield found


@pytest.fixture()
def backend(served: tuple[Backend, Collector]) -> Backend:
    return served[0]


@pytest.fixture()
def oai(backend: Backend) -> Iterator[openai.OpenAI]:
    with client(backend) as found:
        yield found


def refused(response: httpx.Response, status: int, param: str | None = None) -> ErrorObject:
    """The response's OpenAI error, checked against the openai package's own type."""
    assert response.status_code == status, response.text
    error = ErrorObject.model_validate(response.json()["error"])
    assert error.message and error.param == param
    return error


def test_unknown_model_is_404_before_any_stream(backend: Backend, oai: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        oai.completions.create(model="no_such_model", prompt="x", stream=True)
    assert "no_such_model" in caught.value.message
    with raw(backend) as http:
        for path, body in (("/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
                           ("/embeddings", {"input": "x"}), ("/completions", {"prompt": "x", "stream": True})):
            error = refused(http.post(path, json={"model": "no_such_model", **body}), 404)
            assert error.code == "model_not_found" and error.type == "invalid_request_error"  # as OpenAI types it
        refused(http.get("/models/no_such_model"), 404, "model")


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/completions", {"model": "openai_echo"}, "prompt"),
    ("/chat/completions", {"model": "openai_echo"}, "messages"),
    ("/chat/completions", {"model": "openai_echo", "messages": []}, "messages"),
    ("/completions", {"prompt": "x"}, "model"),
    ("/completions", {"model": "openai_echo", "prompt": "x", "max_tokens": 0}, "max_tokens"),
    ("/chat/completions", {"model": "openai_echo", "messages": [{"role": "user", "content": "x"}],
                           "max_completion_tokens": -1}, "max_completion_tokens"),
    ("/completions", {"model": "openai_echo", "prompt": "x", "temperature": "hot"}, "temperature"),
    ("/completions", {"model": "openai_echo", "prompt": "x", "top_p": 5}, "top_p"),
    ("/completions", {"model": "openai_echo", "prompt": "x", "stop": [1, 2]}, "stop"),
    ("/completions", {"model": "openai_echo", "prompt": "x", "n": 0}, "n"),
    ("/completions", {"model": "openai_echo", "prompt": "x", "stream_options": {"include_usage": True}},
     "stream_options"),
    ("/completions", {"model": "openai_echo", "prompt": [1, 2, 3]}, "prompt"),
    ("/chat/completions", {"model": "openai_echo", "messages": [{"role": "wizard", "content": "x"}]},
     "messages[0].role"),
    ("/chat/completions", {"model": "openai_echo", "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages[0].content"),
    ("/embeddings", {"model": "embedder", "input": "x", "encoding_format": "int8"}, "encoding_format"),
    ("/embeddings", {"model": "embedder"}, "input"),
])
def test_bad_requests_are_400_naming_the_field(backend: Backend, path: str, body: dict[str, object],
                                               param: str) -> None:
    with raw(backend) as http:
        assert refused(http.post(path, json=body), 400, param).type == "invalid_request_error"


def test_sampling_parameters_that_are_not_json_values_are_400(backend: Backend) -> None:
    with raw(backend) as http:
        for text in ('{"model": "openai_echo", "prompt": "x", "temperature": NaN}', "{not json", "[1]"):
            response = http.post("/completions", content=text, headers={"Content-Type": "application/json"})
            assert response.status_code == 400 and ErrorObject.model_validate(response.json()["error"])


def test_client_raises_bad_request_for_max_tokens_below_one(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        oai.completions.create(model="openai_echo", prompt="x", max_tokens=0)
    with pytest.raises(openai.BadRequestError, match="role"):
        oai.chat.completions.create(model="openai_echo", messages=[{"role": "robot", "content": "x"}])  # type: ignore[misc,list-item]


def test_model_off_contract_is_refused_naming_what_is_missing(backend: Backend, oai: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        oai.completions.create(model="add_sub", prompt="x")
    message = caught.value.message
    assert "input 'text_input' (BYTES)" in message and "output 'text_output' (BYTES)" in message
    assert "INPUT0" in message  # what the model declares instead
    with pytest.raises(openai.BadRequestError, match="output 'embedding'"):
        oai.embeddings.create(model="openai_echo", input="x")


def test_model_failure_whole_and_mid_stream(backend: Backend, oai: openai.OpenAI) -> None:
    with pytest.raises(openai.InternalServerError, match="failed on request"):
        oai.completions.create(model="openai_echo", prompt="a b <fail>")
    stream = oai.completions.create(model="openai_echo", prompt="a b <fail>", stream=True)
    assert next(stream).choices[0].text == "a "
    with pytest.raises(openai.APIError, match="failed on request"):
        next(stream)
    stream.close()


def test_restricted_group_needs_the_key(backend: Backend) -> None:
    with openai.OpenAI(base_url=backend.openai_url, api_key="wrong", max_retries=0, timeout=30) as wrong, \
            pytest.raises(openai.AuthenticationError, match="authorization"):
        wrong.models.list()
    response = httpx.post(f"{backend.openai_url}/completions", json={"model": "openai_echo", "prompt": "x"})
    assert refused(response, 401).code == "invalid_api_key"
    assert requests.get(f"http://{backend.http_url}/v2/health/ready", timeout=30).status_code == 200  # v2 is open


def test_unknown_route_and_method(backend: Backend) -> None:
    with raw(backend) as http:
        refused(http.get("/nothing"), 404)
        refused(http.get("/completions"), 405)


def test_access_lines_name_the_request(backend: Backend, oai: openai.OpenAI) -> None:
    completion = oai.completions.create(model="openai_echo", prompt="logged")
    line = backend.wait_for_log(rf"HTTP POST /v1/completions 200 [\d.]+ ms id={completion.id} peer=127\.0\.0\.1")
    assert line is not None


def test_metrics_per_model_with_token_latencies(backend: Backend, oai: openai.OpenAI) -> None:
    list(oai.completions.create(model="openai_echo", prompt="a b c d", stream=True))
    with pytest.raises(openai.NotFoundError):
        oai.completions.create(model="never_served", prompt="x")
    with pytest.raises(openai.InternalServerError):
        oai.chat.completions.create(model="openai_echo", messages=[{"role": "user", "content": "<fail> now"}])
    text = requests.get(backend.metrics_url, timeout=30).text
    failures = re.search(r'pystub_openai_request_failures_total\{endpoint="chat/completions",'
                         r'model="openai_echo"\} (\d+)', text)
    assert failures is not None and int(failures.group(1)) >= 1
    requests_line = re.search(r'pystub_openai_requests_total\{endpoint="completions",model="openai_echo"\} (\d+)', text)
    assert requests_line is not None and int(requests_line.group(1)) >= 1
    first = re.search(r'pystub_openai_time_to_first_token_seconds_count\{model="openai_echo"\} (\d+)', text)
    between = re.search(r'pystub_openai_inter_token_latency_seconds_count\{model="openai_echo"\} (\d+)', text)
    assert first is not None and int(first.group(1)) >= 1
    assert between is not None and int(between.group(1)) >= 3  # four words: three gaps at least
    assert re.search(r'nv_inference_request_success\{model="openai_echo",version="1"\} [1-9]', text)
    assert "never_served" not in text  # an unknown name keeps no state


def test_traceparent_is_continued(served: tuple[Backend, Collector]) -> None:
    backend, collector = served
    trace_id, span_id = os.urandom(16).hex(), os.urandom(8).hex()
    with raw(backend) as http:
        response = http.post("/completions", json={"model": "openai_echo", "prompt": "traced", "stream": True},
                             headers={"traceparent": f"00-{trace_id}-{span_id}-01"})
        assert response.status_code == 200
    spans = collector.wait_for("the OpenAI request's spans",
                               lambda found: any(s.trace_id == trace_id and s.name == "openai_echo" for s in found))
    root = next(s for s in spans if s.trace_id == trace_id and s.name == "InferRequest")
    assert root.parent_span_id == span_id


def test_a_chat_template_that_cannot_load_stops_the_start(tmp_path: Path) -> None:
    refused = Backend(tmp_path, "--http-port=0", "--grpc-port=0", "--metrics-port=0", "--openai-port=0",
                      "--chat-template", "{% for %}", expect_exit=True)
    refused.start()
    try:
        assert refused.wait_exit() == 1
        assert "the chat template of --chat-template does not compile" in refused.log()
    finally:
        refused.stop(check=False)
