"""Log probabilities, for a model that returns them (the contract below), in OpenAI's two forms.

The model declares an output `logprobs` (BYTES); asked for logprobs (`logprobs` in its sampling
parameters: how many alternatives per token, vLLM's name and meaning; and `return_logprobs` true
where it declares that input, as vLLM's backend has it), each response carries one element, the
JSON list of the tokens of that response's text:

    [{"token": "Hel", "logprob": -0.31, "top_logprobs": [{"token": "Hel", "logprob": -0.31}, ...]}, ...]

Chat answers `{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}], "refusal": null}`;
completions `{"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}`.
Tokens past the point where the server cut the text at a stop string are left out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pystub_backend.backend.frontends.openai.errors import OpenAIError

__all__ = ["TokenLogprob", "parse_logprobs", "LogprobTrail", "chat_logprobs", "completion_logprobs"]


@dataclass(frozen=True)
class TokenLogprob:
    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()


def _entry(item: object) -> TokenLogprob:
    if not isinstance(item, dict):
        raise TypeError("a token's entry is not an object")
    top = item.get("top_logprobs") or []
    return TokenLogprob(str(item["token"]), float(item["logprob"]),
                        tuple((str(alt["token"]), float(alt["logprob"])) for alt in top))


def parse_logprobs(model: str, text: bytes | None) -> list[TokenLogprob]:
    """One response's element of the `logprobs` output. Raises OpenAIError(500) when it is off contract."""
    if not text:
        return []
    try:
        return [_entry(item) for item in json.loads(text)]
    except (ValueError, TypeError, KeyError, AttributeError):
        raise OpenAIError(500, f"model '{model}' sent a 'logprobs' output that is not a JSON list of "
                               "{\"token\", \"logprob\", \"top_logprobs\"} (docs/openai.md)") from None


@dataclass
class LogprobTrail:
    """One choice's tokens as they arrive; `take(released)` gives those the released text covers."""

    pending: list[TokenLogprob] = field(default_factory=list)
    taken: int = 0  # characters of text the tokens taken so far cover
    offset: int = 0  # text_offset of the next token (completions)

    def add(self, entries: list[TokenLogprob]) -> None:
        self.pending += entries

    def take(self, released: int) -> list[TokenLogprob]:
        """The tokens within the first `released` characters of the text not yet taken."""
        out = []
        while self.pending and self.taken + len(self.pending[0].token) <= released:
            entry = self.pending.pop(0)
            self.taken += len(entry.token)
            out.append(entry)
        return out


def chat_logprobs(entries: list[TokenLogprob]) -> dict[str, Any]:
    def one(token: str, logprob: float) -> dict[str, Any]:
        return {"token": token, "logprob": logprob, "bytes": list(token.encode())}

    return {"content": [{**one(e.token, e.logprob), "top_logprobs": [one(t, p) for t, p in e.top]} for e in entries],
            "refusal": None}


def completion_logprobs(entries: list[TokenLogprob], trail: LogprobTrail) -> dict[str, Any]:
    offsets = []
    for entry in entries:
        offsets.append(trail.offset)
        trail.offset += len(entry.token)
    return {"tokens": [e.token for e in entries], "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [dict(e.top) for e in entries], "text_offset": offsets}
