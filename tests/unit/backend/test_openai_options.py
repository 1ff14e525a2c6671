"""The OpenAI port's flags: off unless --openai-port is given, bound to 127.0.0.1 unless told,
and checked for a busy port with the other listeners."""

from __future__ import annotations

import socket

import pytest

from pystub_backend.backend.arguments import parse_args
from pystub_backend.backend.options import OpenAIOptions
from pystub_backend.backend.port_check import busy_listeners, enabled_endpoints


def test_off_unless_given() -> None:
    options = parse_args(["--model-repository", "/m"])
    assert options.openai == OpenAIOptions() and options.openai.port is None
    assert "OpenAI" not in {endpoint.label for endpoint in enabled_endpoints(options)}


def test_flags_reach_the_options() -> None:
    options = parse_args(["--model-repository", "/m", "--openai-port", "9000", "--openai-address=0.0.0.0",
                          "--tokenizer", "/tok", "--chat-template", "t.jinja"])
    assert options.openai == OpenAIOptions(9000, "0.0.0.0", "/tok", "t.jinja")
    options = parse_args(["--model-repository", "/m", "--openai-port", "9000"])
    assert options.openai.address == "127.0.0.1"
    assert (options.openai.tool_call_parser, options.openai.max_model_len, options.openai.cors_origins) == \
        ("", None, ())


def test_tool_parser_context_length_and_cors_flags(capsys: pytest.CaptureFixture[str]) -> None:
    options = parse_args(["--model-repository", "/m", "--openai-port", "0", "--tool-call-parser", "llama3_json",
                          "--max-model-len", "4096", "--openai-cors-origin", "https://a, https://b",
                          "--openai-cors-origin", "*"])
    assert options.openai.tool_call_parser == "llama3_json" and options.openai.max_model_len == 4096
    assert options.openai.cors_origins == ("https://a", "https://b", "*")
    for bad in (["--tool-call-parser", "gpt"], ["--max-model-len", "0"]):
        with pytest.raises(SystemExit) as caught:
            parse_args(["--model-repository", "/m", *bad])
        assert caught.value.code == 2
    assert "invalid choice: 'gpt'" in capsys.readouterr().err


def test_a_busy_openai_port_is_reported_before_models_load() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        options = parse_args(["--model-repository", "/m", "--http-port=0", "--grpc-port=0", "--metrics-port=0",
                              "--openai-port", str(port)])
        problems = busy_listeners(options)
    assert len(problems) == 1 and problems[0].startswith(f"OpenAI port 127.0.0.1:{port} cannot be bound")


def test_the_openai_group_is_restricted_over_http_only(capsys: pytest.CaptureFixture[str]) -> None:
    options = parse_args(["--model-repository", "/m", "--http-restricted-api", "openai:authorization=Bearer k"])
    assert options.http_restrictions["openai"].value == "Bearer k"
    with pytest.raises(SystemExit) as caught:
        parse_args(["--model-repository", "/m", "--grpc-restricted-protocol", "openai:k=v"])
    assert caught.value.code == 2
    assert "--http-restricted-api openai:<key>=<value>" in capsys.readouterr().err
