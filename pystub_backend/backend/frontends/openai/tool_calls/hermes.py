"""Hermes and Qwen: each call a JSON object between tags, anywhere in the text.

    Let me look that up.<tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
    <tool_call>
    {"name": "get_time", "arguments": {"zone": "CET"}}
    </tool_call>

Text outside the tags is content (whitespace between and after calls is dropped); a start of
`<tool_call>` at the end of what has come is held back until the next text decides it. A block
that is not a call is given back as content, tags and all.
"""

from __future__ import annotations

from pystub_backend.backend.frontends.openai.marks import partial_suffix
from pystub_backend.backend.frontends.openai.tool_calls.pieces import Content, IdMaker, Piece, openai_id
from pystub_backend.backend.frontends.openai.tool_calls.scanner import CallScanner

__all__ = ["HermesParser"]

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"


class HermesParser:
    def __init__(self, new_id: IdMaker = openai_id) -> None:
        self._new_id = new_id
        self._buffer = ""  # text not yet decided
        self._call: CallScanner | None = None
        self._closing = False  # a call is complete: its </tool_call> may follow
        self._calls = 0

    def feed(self, text: str) -> list[Piece]:
        self._buffer += text
        pieces: list[Piece] = []
        while self._buffer:
            if self._call is not None:
                self._in_call(pieces)
            elif self._closing:
                if not self._close():
                    break
            elif not self._content(pieces):
                break
        return pieces

    def finish(self) -> list[Piece]:
        pieces: list[Piece] = []
        if self._call is not None:
            pieces += self._call.flush() if self._call.streaming else [Content(_OPEN + self._call.raw)]
        elif not self._closing and (self._calls == 0 or self._buffer.strip()):
            pieces += [Content(self._buffer)] if self._buffer else []
        self._buffer, self._call = "", None
        return pieces

    def _in_call(self, pieces: list[Piece]) -> None:
        call = self._call
        assert call is not None
        found, rest = call.feed(self._buffer)
        pieces += found
        self._buffer = rest or ""
        if call.invalid:
            pieces.append(Content(_OPEN + call.raw))
            self._calls -= 1
            self._call = None
        elif call.complete:
            self._call, self._closing = None, True

    def _close(self) -> bool:
        """Past a complete call: skip its </tool_call>. False while the text cannot tell yet."""
        stripped = self._buffer.lstrip()
        if not stripped or (len(stripped) < len(_CLOSE) and _CLOSE.startswith(stripped)):
            return False
        self._buffer = stripped[len(_CLOSE):] if stripped.startswith(_CLOSE) else stripped
        self._closing = False
        return True

    def _content(self, pieces: list[Piece]) -> bool:
        """Content up to the next <tool_call>. False when the rest must wait for more text."""
        index = self._buffer.find(_OPEN)
        if index < 0:
            held = partial_suffix(self._buffer, _OPEN)
            text = self._buffer[:len(self._buffer) - held]
            if self._calls and not text.strip():
                return False  # whitespace after a call: dropped unless more content follows
            if text:
                pieces.append(Content(text))
            self._buffer = self._buffer[len(text):]
            return False
        before = self._buffer[:index]
        if before and (before.strip() or not self._calls):
            pieces.append(Content(before))
        self._buffer = self._buffer[index + len(_OPEN):]
        self._call = CallScanner(self._calls, self._new_id)
        self._calls += 1
        return True
