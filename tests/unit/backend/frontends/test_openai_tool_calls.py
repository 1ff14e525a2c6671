"""The tool-call parsers of the OpenAI port (--tool-call-parser): each format read whole and in
every kind of split, with the same result both ways (a stream's fragments join to the whole
answer), content around calls, a start of a tag held back, calls that are not calls given back
as text, and ids in the format's own shape."""

from __future__ import annotations

import functools
import itertools
import json
import random
from collections.abc import Callable

import pytest

from pystub_backend.backend.frontends.openai.tool_calls import (
    PARSERS,
    CallDelta,
    Content,
    JsonListParser,
    NamedCallParser,
    ToolCallParser,
    assemble,
)
from pystub_backend.backend.frontends.openai.tool_calls.pieces import Piece
from pystub_backend.backend.options import TOOL_CALL_PARSERS

ARGS = {"city": "Paris", "nested": {"list": [1, "}", {"q": '"quoted" ]'}]}, "ok": True}
TWO = [("get_weather", ARGS), ("get_time", {})]


def feed(parser: ToolCallParser, text: str, sizes: Callable[[], int] | None = None) -> list[Piece]:
    if sizes is None:
        return parser.feed(text) + parser.finish()
    pieces: list[Piece] = []
    start = 0
    while start < len(text):
        size = sizes()
        pieces += parser.feed(text[start:start + size])
        start += size
    return pieces + parser.finish()


def result(pieces: list[Piece]) -> tuple[str, list[tuple[str, object]]]:
    whole = assemble(pieces)
    return whole.content, [(call.name, json.loads(call.arguments)) for call in whole.calls]


def same_in_every_split(make: Callable[[], ToolCallParser], text: str) -> tuple[str, list[tuple[str, object]]]:
    """The whole reading, checked against one character at a time and random splits."""
    whole = result(feed(make(), text))
    assert result(feed(make(), text, lambda: 1)) == whole
    for seed in range(40):
        chooser = random.Random(seed)
        assert result(feed(make(), text, functools.partial(chooser.randint, 1, 7))) == whole, seed
    return whole


HERMES = ('Let me look.<tool_call>\n{"name": "get_weather", "arguments": ' + json.dumps(ARGS) + '}\n</tool_call>\n'
          '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
LLAMA3 = json.dumps({"name": "get_weather", "parameters": ARGS}) + "; " + '{"name": "get_time", "parameters": {}}'
MISTRAL = "Sure. [TOOL_CALLS]" + json.dumps([{"name": n, "arguments": a} for n, a in TWO])
MISTRAL_V11 = "[TOOL_CALLS]get_weather[ARGS]" + json.dumps(ARGS) + "[TOOL_CALLS]get_time[ARGS]{}"


@pytest.mark.parametrize(("name", "text", "content"), [
    ("hermes", HERMES, "Let me look."), ("llama3", LLAMA3, ""), ("llama3", "<|python_tag|>" + LLAMA3, ""),
    ("mistral", MISTRAL, "Sure. "), ("mistral", MISTRAL_V11, "")])
def test_each_format_whole_and_streamed(name: str, text: str, content: str) -> None:
    assert same_in_every_split(PARSERS[name], text) == (content, TWO)


def test_arguments_stream_as_the_model_writes_them() -> None:
    parser = PARSERS["hermes"]()
    pieces = feed(parser, HERMES, lambda: 3)
    calls = [piece for piece in pieces if isinstance(piece, CallDelta)]
    assert [(c.index, c.name) for c in calls if c.id is not None] == [(0, "get_weather"), (1, "get_time")]
    first = [c for c in calls if c.index == 0]
    assert first[0].id is not None and all(c.id is None for c in first[1:]) and len(first) > 10
    assert "".join(c.arguments for c in first) == json.dumps(ARGS)  # the model's own text, nothing re-encoded


def test_a_partial_tag_is_held_back_and_released_when_it_is_not_one() -> None:
    parser = PARSERS["hermes"]()
    assert parser.feed("2 <tool") == [Content("2 ")]
    assert parser.feed("s are fun") == [Content("<tools are fun")]
    assert parser.finish() == []


@pytest.mark.parametrize(("name", "text"), [
    ("hermes", "no calls here < tool_call"), ("hermes", "<tool_call>not json</tool_call> after"),
    ("hermes", '<tool_call>{"no": "name"}</tool_call>'), ("hermes", "<tool_call>{\"name\": \"f\", \"argu"),
    ("llama3", "Hello {\"x\": 1}"), ("llama3", '{"answer": 42}'), ("llama3", "  plain"),
    ("mistral", "just text [TOOL"), ("mistral", "[TOOL_CALLS]name without args")])
def test_text_that_is_no_call_is_content(name: str, text: str) -> None:
    content, calls = same_in_every_split(PARSERS[name], text)
    assert calls == [] and content.replace(" ", "") in text.replace(" ", "")


def test_unusual_key_order_and_string_arguments_arrive_whole() -> None:
    text = ('<tool_call>{"arguments": {"a": 1}, "name": "late"}</tool_call>'
            '<tool_call>{"name": "s", "arguments": ' + json.dumps(json.dumps({"b": 2})) + '}</tool_call>')
    assert same_in_every_split(PARSERS["hermes"], text) == ("", [("late", {"a": 1}), ("s", {"b": 2})])


def test_ids_are_openai_s_and_mistral_s() -> None:
    hermes = assemble(feed(PARSERS["hermes"](), HERMES)).calls
    mistral = assemble(feed(PARSERS["mistral"](), MISTRAL)).calls
    assert all(call.id.startswith("call_") and len(call.id) == 29 for call in hermes)
    assert all(len(call.id) == 9 and call.id.isalnum() for call in mistral)
    assert len({call.id for call in itertools.chain(hermes, mistral)}) == 4


def test_guided_forms_named_and_required() -> None:
    assert same_in_every_split(lambda: NamedCallParser("f"), json.dumps(ARGS)) == ("", [("f", ARGS)])
    assert result(feed(NamedCallParser("f"), "")) == ("", [("f", {})])
    listed = json.dumps([{"name": n, "parameters": a} for n, a in TWO])
    assert same_in_every_split(JsonListParser, listed) == ("", TWO)


def test_the_flag_s_names_are_the_parsers() -> None:
    assert set(TOOL_CALL_PARSERS) == set(PARSERS)


def test_a_streaming_call_keeps_only_what_it_has_not_sent() -> None:
    """A long call costs its length: the scanner holds back a few characters, never what it sent."""
    from pystub_backend.backend.frontends.openai.tool_calls.pieces import openai_id
    from pystub_backend.backend.frontends.openai.tool_calls.scanner import CallScanner

    text = json.dumps({"name": "write", "arguments": {"content": "x " * 50_000}})
    scanner, held, sent = CallScanner(0, openai_id), 0, ""
    for start in range(0, len(text), 4):
        pieces, _ = scanner.feed(text[start:start + 4])
        sent += "".join(p.arguments for p in pieces if isinstance(p, CallDelta))
        held = max(held, len(scanner.raw))
    assert scanner.complete and json.loads(sent) == {"content": "x " * 50_000}
    assert held < 64  # the head, then a trailing space or the closing braces
