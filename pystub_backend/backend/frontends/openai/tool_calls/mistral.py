"""Mistral: `[TOOL_CALLS]` and then a JSON list of calls (tokenizers before v11), or the name and
`[ARGS]` and the arguments (v11 and later), one such group a call:

    [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": ...}]
    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{"zone": "CET"}

Text before `[TOOL_CALLS]` (and after a list) is content. Ids are nine letters and digits, the only
ids Mistral's chat templates accept back. `JsonListParser` is the list alone, as a model writes
it under a `tool_choice` of "required" (guided by the schema of such a list).
"""

from __future__ import annotations

from pystub_backend.backend.frontends.openai.marks import partial_suffix
from pystub_backend.backend.frontends.openai.tool_calls.pieces import Content, IdMaker, Piece, mistral_id, openai_id
from pystub_backend.backend.frontends.openai.tool_calls.scanner import CallScanner

__all__ = ["MistralParser", "JsonListParser"]

_TAG, _ARGS = "[TOOL_CALLS]", "[ARGS]"
_CONTENT, _TAGGED, _LIST, _CALL, _NAME = "content", "tagged", "list", "call", "name"


class MistralParser:
    def __init__(self, new_id: IdMaker = mistral_id, tagged: bool = True) -> None:
        self._new_id = new_id
        self._tag = _TAG if tagged else ""
        self._state = _CONTENT if tagged else _TAGGED
        self._buffer = ""
        self._call: CallScanner | None = None
        self._listed = False  # the call being read is an element of a list (else v11's name[ARGS]{...})
        self._calls = 0

    def feed(self, text: str) -> list[Piece]:
        self._buffer += text
        pieces: list[Piece] = []
        while self._buffer and self._step(pieces):
            pass
        return pieces

    def finish(self) -> list[Piece]:
        pieces: list[Piece] = []
        if self._call is not None:
            pieces += self._call.flush() if self._call.streaming else [Content(self._call.raw)]
        elif self._state == _CONTENT and self._buffer:
            pieces.append(Content(self._buffer))
        elif self._state == _NAME:  # a name that no [ARGS] followed: not a call
            pieces.append(Content(self._tag + self._buffer))
        self._buffer, self._call = "", None
        return pieces

    def _step(self, pieces: list[Piece]) -> bool:
        """One state's worth of the buffer. False while the rest must wait for more text."""
        if self._state == _CONTENT:
            return self._content(pieces)
        if self._state == _CALL:
            return self._in_call(pieces)
        if self._state == _NAME:
            return self._named()
        stripped = self._buffer.lstrip()
        if not stripped:
            return False
        if self._state == _TAGGED:  # just past [TOOL_CALLS]: a list, or a name
            if stripped[0] == "[":
                self._buffer, self._state = stripped[1:], _LIST
                return True
            self._buffer, self._state = stripped, _NAME
            return True
        if self._state == _LIST:  # before a call of the list, or after one
            if stripped[0] in ",{":
                self._buffer = stripped[1:] if stripped[0] == "," else stripped
                self._start_call()
                return True
            self._buffer = stripped[1:] if stripped[0] == "]" else stripped
        self._state = _CONTENT
        return True

    def _content(self, pieces: list[Piece]) -> bool:
        index = self._buffer.find(_TAG)
        end = index if index >= 0 else len(self._buffer) - partial_suffix(self._buffer, _TAG)
        if self._buffer[:end] and (self._buffer[:end].strip() or not self._calls):
            pieces.append(Content(self._buffer[:end]))
        if index < 0:
            self._buffer = self._buffer[end:]
            return False
        self._buffer, self._state = self._buffer[index + len(_TAG):], _TAGGED
        return True

    def _named(self) -> bool:
        """v11: the name, up to [ARGS]."""
        index = self._buffer.find(_ARGS)
        if index < 0:
            return False
        self._start_call(self._buffer[:index].strip())
        self._buffer = self._buffer[index + len(_ARGS):]
        return True

    def _start_call(self, name: str | None = None) -> None:
        self._call = CallScanner(self._calls, self._new_id, name)
        self._listed = name is None
        self._calls += 1
        self._state = _CALL

    def _in_call(self, pieces: list[Piece]) -> bool:
        call = self._call
        assert call is not None
        found, rest = call.feed(self._buffer)
        pieces += found
        self._buffer = rest or ""
        if call.invalid:
            pieces.append(Content(call.raw))
            self._calls -= 1
            self._state, self._call = _CONTENT, None
        elif call.complete:
            self._state, self._call = (_LIST if self._listed else _CONTENT), None
        return True


class JsonListParser(MistralParser):
    """The JSON list of calls alone: `[{"name": ..., "parameters": {...}}, ...]`."""

    def __init__(self, new_id: IdMaker = openai_id) -> None:
        super().__init__(new_id, tagged=False)
