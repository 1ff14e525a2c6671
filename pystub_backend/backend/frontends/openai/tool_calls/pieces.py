"""What a tool-call parser makes of a model's text: content, and tool calls in fragments.

    Content(text)                                 text for the message's `content`
    CallDelta(index, arguments, id=, name=)       a fragment of call `index`: the first fragment of a
                                                  call carries its id and function name; the
                                                  `arguments` of all its fragments, joined, are the
                                                  call's arguments as JSON text

A stream sends each piece as it comes (`delta.content`, `delta.tool_calls`); a whole answer joins
them (`assemble`), so the two never disagree.
"""

from __future__ import annotations

import secrets
import string
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["Content", "CallDelta", "Piece", "ToolCall", "Assembled", "assemble", "ToolCallParser", "IdMaker",
           "openai_id", "mistral_id"]


@dataclass(frozen=True)
class Content:
    text: str


@dataclass(frozen=True)
class CallDelta:
    index: int
    arguments: str
    id: str | None = None
    name: str | None = None


Piece = Content | CallDelta
IdMaker = Callable[[], str]


class ToolCallParser(Protocol):
    """Fed the model's text as it arrives; `finish()` once it has all come."""

    def feed(self, text: str) -> list[Piece]: ...

    def finish(self) -> list[Piece]: ...


def _joined(parts: list[str]) -> str:
    """The parts as one text (kept joined: a long answer or call is many fragments)."""
    if len(parts) > 1:
        parts[:] = ["".join(parts)]
    return parts[0] if parts else ""


@dataclass
class ToolCall:
    id: str
    name: str
    _arguments: list[str] = field(default_factory=list)

    @property
    def arguments(self) -> str:
        return _joined(self._arguments)


@dataclass
class Assembled:
    calls: list[ToolCall] = field(default_factory=list)
    _content: list[str] = field(default_factory=list)

    @property
    def content(self) -> str:
        return _joined(self._content)

    def add(self, pieces: Iterable[Piece]) -> None:
        for piece in pieces:
            if isinstance(piece, Content):
                self._content.append(piece.text)
            elif piece.id is not None:
                self.calls.append(ToolCall(piece.id, piece.name or "", [piece.arguments]))
            else:
                self.calls[piece.index]._arguments.append(piece.arguments)


def assemble(pieces: Iterable[Piece]) -> Assembled:
    whole = Assembled()
    whole.add(pieces)
    return whole


def openai_id() -> str:
    """`call_` and 24 hex digits, as OpenAI's and vLLM's ids look."""
    return f"call_{secrets.token_hex(12)}"


_ALPHANUMERIC = string.ascii_letters + string.digits


def mistral_id() -> str:
    """Nine letters and digits: Mistral's chat templates refuse any other tool-call id."""
    return "".join(secrets.choice(_ALPHANUMERIC) for _ in range(9))
