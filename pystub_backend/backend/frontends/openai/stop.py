"""`stop` enforced by the server: the text ends before the first stop string (with it, under
vLLM's `include_stop_str_in_output`), whatever the model does with the strings itself.

Streamed, the end of what has come that could begin a stop string is held back until the next
text decides it; once a stop string is found, `stopped` turns true and nothing more is let through
(the caller cancels the request in the model). With `echo`, the prompt the model repeats is let
through unexamined (vLLM looks for stop strings in the generated text only).
"""

from __future__ import annotations

from pystub_backend.backend.frontends.openai.marks import partial_suffix

__all__ = ["StopFilter"]


class StopFilter:
    def __init__(self, stops: list[str], include: bool = False, skip: int = 0) -> None:
        self._stops = [stop for stop in stops if stop]
        self._include = include
        self._skip = skip  # characters at the start not examined (an echoed prompt)
        self._held = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """What of `text` (and of what was held) may go out now."""
        if self.stopped:
            return ""
        if self._skip:
            passed, text = text[:self._skip], text[self._skip:]
            self._skip -= len(passed)
            return passed + self.feed(text) if text else passed
        text = self._held + text
        first = self._first_stop(text)
        if first is not None:
            index, stop = first
            self.stopped, self._held = True, ""
            return text[:index + len(stop)] if self._include else text[:index]
        held = max(partial_suffix(text, stop) for stop in self._stops)
        self._held = text[len(text) - held:] if held else ""
        return text[:len(text) - held]

    def finish(self) -> str:
        """The text ended: what was held back was no stop string."""
        held, self._held = self._held, ""
        return held

    def _first_stop(self, text: str) -> tuple[int, str] | None:
        found = [(index, stop) for stop in self._stops if (index := text.find(stop)) >= 0]
        return min(found, key=lambda item: (item[0], -len(item[1]))) if found else None
