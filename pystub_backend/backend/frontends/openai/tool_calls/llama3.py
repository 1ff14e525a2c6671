"""Llama 3.1-3.3 JSON tool calls: the answer is the call itself, or calls separated by ";",
optionally after `<|python_tag|>`:

    {"name": "get_weather", "parameters": {"city": "Paris"}}
    <|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "parameters": {}}

An answer whose first text (past whitespace) is neither `{` nor the tag is content throughout;
one that opens like a call but is not one (JSON without a name) is given back as content.
"""

from __future__ import annotations

from pystub_backend.backend.frontends.openai.tool_calls.pieces import Content, IdMaker, Piece, openai_id
from pystub_backend.backend.frontends.openai.tool_calls.scanner import CallScanner

__all__ = ["Llama3JsonParser"]

_TAG = "<|python_tag|>"
_START, _CALL, _BETWEEN, _CONTENT = "start", "call", "between", "content"


class Llama3JsonParser:
    def __init__(self, new_id: IdMaker = openai_id) -> None:
        self._new_id = new_id
        self._state = _START
        self._buffer = ""
        self._call: CallScanner | None = None
        self._calls = 0

    def feed(self, text: str) -> list[Piece]:
        self._buffer += text
        pieces: list[Piece] = []
        while self._buffer:
            if self._state == _CONTENT:
                pieces.append(Content(self._buffer))
                self._buffer = ""
            elif self._state == _CALL:
                self._in_call(pieces)
            elif not self._decide():
                break
        return pieces

    def finish(self) -> list[Piece]:
        pieces: list[Piece] = []
        if self._call is not None:
            pieces += self._call.flush() if self._call.streaming else [Content(self._call.raw)]
        elif self._state == _START and self._buffer:
            pieces.append(Content(self._buffer))
        self._buffer, self._call = "", None
        return pieces

    def _decide(self) -> bool:
        """At the start or between calls: what comes next. False while the text cannot tell yet."""
        stripped = self._buffer.lstrip()
        if not stripped:
            return False
        if self._state == _BETWEEN:
            if stripped[0] != ";":
                self._state, self._buffer = _CONTENT, stripped
                return True
            stripped = stripped[1:]
        elif stripped.startswith(_TAG):
            stripped = stripped[len(_TAG):]
        elif _TAG.startswith(stripped):
            return False
        elif stripped[0] != "{":
            self._state = _CONTENT
            return True
        self._buffer, self._state = stripped, _CALL
        self._call = CallScanner(self._calls, self._new_id)
        self._calls += 1
        return True

    def _in_call(self, pieces: list[Piece]) -> None:
        call = self._call
        assert call is not None
        found, rest = call.feed(self._buffer)
        pieces += found
        self._buffer = rest or ""
        if call.invalid:  # not a call after all: it, and all that follows, is content
            pieces.append(Content(call.raw))
            self._state, self._call = _CONTENT, None
        elif call.complete:
            self._state, self._call = _BETWEEN, None
