"""A `tool_choice` naming a function: guided by the function's parameters schema, the model's
whole text is the arguments of one call to it (as vLLM and Triton's frontend answer it)."""

from __future__ import annotations

from pystub_backend.backend.frontends.openai.tool_calls.pieces import CallDelta, IdMaker, Piece, openai_id

__all__ = ["NamedCallParser"]


class NamedCallParser:
    def __init__(self, name: str, new_id: IdMaker = openai_id) -> None:
        self._name = name
        self._new_id = new_id
        self._started = False

    def feed(self, text: str) -> list[Piece]:
        if not text:
            return []
        if self._started:
            return [CallDelta(0, text)]
        self._started = True
        return [CallDelta(0, text, self._new_id(), self._name)]

    def finish(self) -> list[Piece]:
        return [] if self._started else self.feed("{}")  # a model that wrote nothing: no arguments
