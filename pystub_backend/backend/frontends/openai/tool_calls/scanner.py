"""One tool call written as a JSON object, `{"name": "f", "arguments": {...}}` ("parameters" as
Llama 3 writes it), read as its characters arrive.

In the usual order (the name first, the arguments an object) the call's id and name go out as
soon as the name is complete and the arguments as they come, character for character as the model
wrote them (OpenAI's `arguments` is JSON text: the model's own spacing is as good as any). In any
other order, or with arguments that are a string, the whole call goes out when the object is
complete. A text that is not a call (not an object, not JSON, no name) is `invalid`: the parser
that framed it gives its text back as content.

    feed(text) -> (pieces, rest)    rest: the text after the object once it is complete, else None

Each character is looked at once, and kept only while it waits: what was sent is dropped, and a
call that cannot stream is kept as pieces joined once, so a call of a megabyte in four-character
responses costs what its length does.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pystub_backend.backend.frontends.openai.tool_calls.pieces import CallDelta, IdMaker, Piece

__all__ = ["CallScanner"]

# The usual head of a call, up to the "{" that opens its arguments (not consumed).
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\{)')
_HEAD_WITHIN = 1024  # characters: a head that has not come by then is not the usual one
_ARGUMENT_KEYS = ("arguments", "parameters")


class CallScanner:
    def __init__(self, index: int, new_id: IdMaker, name: str | None = None) -> None:
        """With `name`, the text is the arguments object alone (Mistral's `name[ARGS]{...}`)."""
        self.index = index
        self._new_id = new_id
        self._text = ""  # read and not sent
        self._parts: list[str] | None = None  # instead of _text, for a long call that did not stream
        self._offset = 0  # characters read before _text (sent and dropped)
        self._length = 0  # characters read
        self._depth = 0
        self._in_string = False
        self._escaped = False
        self._opened = False
        self._commas = 0  # at the top level of the object: past the first, the usual head cannot come
        self._name = name
        self._head_end: int | None = 0 if name is not None else None  # where the arguments begin
        self._value_depth = 1 if name is not None else 2  # the depth inside the arguments object
        self._value_end: int | None = None
        self.complete = False
        self.invalid = False
        self.streaming = False  # the id and name have gone out

    @property
    def raw(self) -> str:
        """What was read and not sent (all of it, for a parser that gives an invalid call back as text)."""
        if self._parts is not None:
            self._parts[:] = ["".join(self._parts)]
            return self._parts[0]
        return self._text

    def feed(self, text: str) -> tuple[list[Piece], str | None]:
        start = self._length
        if self._parts is not None:
            self._parts.append(text)
        else:
            self._text += text
            if not self.streaming and start >= _HEAD_WITHIN:  # it will not stream: pieces from now on
                self._parts, self._text = [self._text], ""
        self._length += len(text)
        pieces: list[Piece] = []
        if not self.streaming and self._name is not None:
            pieces.append(CallDelta(self.index, "", self._new_id(), self._name))
            self.streaming = True
        elif not self.streaming and self._head_end is None and self._commas <= 1 and start < _HEAD_WITHIN:
            pieces += self._head()
        rest = self._scan(text, start)
        if self.invalid:
            return pieces, rest
        if self.streaming:
            pieces += self._arguments()
        elif self.complete:
            pieces += self._whole()
        return pieces, rest

    def flush(self) -> list[Piece]:
        """The text ended inside the object: what is left of the arguments, if they were streaming."""
        return self._arguments() if self.streaming else []

    def _head(self) -> list[Piece]:
        match = _HEAD.match(self.raw)
        if match is None:
            return []
        try:
            name = json.loads(f'"{match[1]}"')
        except ValueError:
            return []
        self._head_end = match.end()
        self.streaming = True
        return [CallDelta(self.index, "", self._new_id(), name)]

    def _cut(self, text: str, keep: int) -> str:
        """Keep `keep` characters of `text`, the last read; the rest is what followed the object."""
        cut = len(text) - keep
        if cut:
            if self._parts is not None:
                self._parts[-1] = self._parts[-1][:-cut]
            else:
                self._text = self._text[:-cut]
            self._length -= cut
        return text[keep:]

    def _scan(self, text: str, start: int) -> str | None:
        """Depth and strings through `text` (read from `start` on); what followed the object once it closes."""
        for offset, char in enumerate(text):
            if not self._opened:
                if char.isspace():
                    continue
                if char != "{":
                    self.invalid = True
                    return self._cut(text, offset)
                self._opened = True
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif char == "\\":
                    self._escaped = True
                elif char == '"':
                    self._in_string = False
                continue
            if char == '"':
                self._in_string = True
            elif char in "{[":
                self._depth += 1
            elif char in "}]":
                self._depth -= 1
                if self._depth == self._value_depth - 1 and self._head_end is not None and \
                        start + offset >= self._head_end and self._value_end is None:
                    self._value_end = start + offset + 1
            elif char == "," and self._depth == 1:
                self._commas += 1
            if self._depth == 0:
                self.complete = True
                return self._cut(text, offset + 1)
        return None

    def _arguments(self) -> list[Piece]:
        """The arguments read and not sent; trailing whitespace waits (it may end the value)."""
        assert self._head_end is not None
        pending = self._text
        end = self._value_end if self._value_end is not None else self._offset + len(pending.rstrip())
        begin = max(self._head_end, self._offset)
        if end <= begin:
            return []
        fragment = pending[begin - self._offset:end - self._offset]
        self._text = pending[end - self._offset:]
        self._offset = end
        return [CallDelta(self.index, fragment)]

    def _whole(self) -> list[Piece]:
        try:
            document = json.loads(self.raw)
        except (ValueError, RecursionError):
            document = None
        if not isinstance(document, dict) or not isinstance(document.get("name"), str):
            self.invalid = True
            return []
        arguments: Any = next((document[key] for key in _ARGUMENT_KEYS if key in document), {})
        text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        return [CallDelta(self.index, text, self._new_id(), document["name"])]
