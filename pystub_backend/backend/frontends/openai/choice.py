"""One choice of an answer: the model's responses for it, turned into what the client gets.

    text_output -> StopFilter (cut at the first stop string, a partial one held back)
                -> the tool-call parser, if the request has tools (content and call fragments)
                -> pieces, and the logprobs of the tokens they cover

A stream sends the pieces of each response as they come; a whole answer sends what they add up
to (`assembled`): both are the same pieces.
"""

from __future__ import annotations

from pystub_backend.backend.frontends.openai.contract import response_logprobs, response_text, token_counts
from pystub_backend.backend.frontends.openai.logprobs import LogprobTrail, TokenLogprob, parse_logprobs
from pystub_backend.backend.frontends.openai.stop import StopFilter
from pystub_backend.backend.frontends.openai.tool_calls import Assembled, CallDelta, Content, Piece, ToolCallParser
from pystub_backend.backend.inference import InferResponse

__all__ = ["Choice", "Step"]

Step = tuple[list[Piece], list[TokenLogprob]]


class Choice:
    def __init__(self, index: int, model: str, stop: StopFilter | None = None, parser: ToolCallParser | None = None,
                 parallel: bool = True, logprobs: bool = False) -> None:
        self.index = index
        self._model = model
        self._stop = stop
        self._parser = parser
        self._parallel = parallel  # parallel_tool_calls false: the first call only
        self.trail = LogprobTrail() if logprobs else None
        self.logprobs: list[TokenLogprob] = []  # those let through so far
        self.assembled = Assembled()
        self.text: list[str] = []  # the text let through, before tool calls are parsed from it
        self._released = 0
        # what the model reports (vLLM's outputs): the prompt's tokens with each response, and the
        # tokens of each response (a stream's are its deltas: they add up)
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None

    @property
    def stopped(self) -> bool:
        """A stop string ended the text: the model's request is to be cancelled."""
        return self._stop is not None and self._stop.stopped

    def take(self, response: InferResponse) -> Step:
        """The pieces of one response of the model."""
        text = response_text(response)
        prompt_tokens, completion_tokens = token_counts(response)
        if prompt_tokens is not None:
            self.prompt_tokens = prompt_tokens
        if completion_tokens is not None:
            self.completion_tokens = (self.completion_tokens or 0) + completion_tokens
        if self.trail is not None:
            self.trail.add(parse_logprobs(self._model, response_logprobs(response)))
        return self._let_through(self._stop.feed(text) if self._stop is not None else text)

    def finish(self) -> Step:
        """The model's last response is in: what was held back."""
        pieces, entries = self._let_through(self._stop.finish() if self._stop is not None else "")
        if self._parser is not None:
            last = self._kept(self._parser.finish())
            self.assembled.add(last)
            pieces = pieces + last
        if self.trail is not None and not self.stopped:
            self.logprobs += self.trail.pending
            entries, self.trail.pending = entries + self.trail.pending, []
        return pieces, entries

    def finish_reason(self, completion_tokens: int, max_tokens: int | None) -> str:
        if self.assembled.calls:
            return "tool_calls"
        if not self.stopped and max_tokens is not None and completion_tokens >= max_tokens:
            return "length"
        return "stop"

    def _let_through(self, text: str) -> Step:
        if text:
            self.text.append(text)
            self._released += len(text)
        if self._parser is not None:
            pieces = self._kept(self._parser.feed(text)) if text else []
        else:
            pieces = [Content(text)] if text else []
        self.assembled.add(pieces)
        if self.trail is None:
            return pieces, []
        entries = self.trail.take(self._released)
        self.logprobs += entries
        return pieces, entries

    def _kept(self, pieces: list[Piece]) -> list[Piece]:
        if self._parallel:
            return pieces
        return [piece for piece in pieces if not isinstance(piece, CallDelta) or piece.index == 0]
