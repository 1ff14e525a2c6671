"""Markers in streamed text: a marker (a stop string, `<tool_call>`) may arrive split across two
responses, so the end of what has come that could begin one is held back until it is decided."""

from __future__ import annotations

__all__ = ["partial_suffix"]


def partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of `text` that is a beginning of `marker` (shorter than it)."""
    longest = min(len(marker) - 1, len(text))
    start = text.find(marker[0], len(text) - longest) if longest > 0 else -1
    while start >= 0:
        if marker.startswith(text[start:]):
            return len(text) - start
        start = text.find(marker[0], start + 1)
    return 0
