"""Counting tokens for `usage` and the context length, and token-id prompts.

With a tokenizer (`tokenizer.json` in the `--tokenizer` directory, read by the `tokenizers`
library, nothing downloaded) counts are the model's tokens: a completion's prompt with the
tokenizer's special tokens added (a BOS, as vLLM adds it), a chat prompt as rendered (the template
wrote its special tokens), generated text without. Without one, whitespace-separated words: an
estimate, which docs/openai.md says. A model that reports its own counts (vLLM's
`num_input_tokens` / `num_output_tokens`) overrides both.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Protocol

from pystub_backend.backend.frontends.openai.errors import invalid

__all__ = ["TokenCounter", "WordCounter", "TokenizerCounter", "TokenizerError", "load_token_counter"]

_WORD = re.compile(r"\S+")


class TokenizerError(Exception):
    """The tokenizer cannot be read (a start-up error)."""


class TokenCounter(Protocol):
    exact: bool  # tokens (a tokenizer) rather than words

    def count(self, text: str, special_tokens: bool = False) -> int: ...

    def decode(self, ids: list[int]) -> str:
        """The text of token ids. Raises OpenAIError(400) without a tokenizer or for an unknown id."""
        ...


class WordCounter:
    exact = False

    def count(self, text: str, special_tokens: bool = False) -> int:
        return len(_WORD.findall(text))

    def decode(self, ids: list[int]) -> str:
        raise invalid("token-id prompts need a tokenizer: start the server with --tokenizer DIRECTORY holding "
                      "tokenizer.json", "prompt")


class _Encoding(Protocol):
    @property
    def ids(self) -> list[int]: ...


class _Tokenizer(Protocol):
    """What this module uses of a `tokenizers.Tokenizer`."""

    def encode(self, sequence: str, pair: None = ..., is_pretokenized: bool = ...,
               add_special_tokens: bool = ...) -> _Encoding: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...

    def get_vocab_size(self, with_added_tokens: bool = ...) -> int: ...


class TokenizerCounter:
    exact = True

    def __init__(self, tokenizer: _Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._size = tokenizer.get_vocab_size(with_added_tokens=True)

    def count(self, text: str, special_tokens: bool = False) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=special_tokens).ids)

    def decode(self, ids: list[int]) -> str:
        unknown = [token for token in ids if not 0 <= token < self._size]
        if unknown:
            raise invalid(f"token id {unknown[0]} is not in the tokenizer's vocabulary of {self._size}", "prompt")
        return str(self._tokenizer.decode(ids, skip_special_tokens=False))


def load_token_counter(tokenizer: str) -> TokenCounter:
    """A TokenizerCounter when the --tokenizer directory holds tokenizer.json, else a WordCounter.
    Raises TokenizerError when it holds one that cannot be read."""
    if not tokenizer:
        return WordCounter()
    path = Path(tokenizer)
    file = (path.parent if path.is_file() else path) / "tokenizer.json"
    if not file.is_file():
        return WordCounter()
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise TokenizerError(f"{file} needs the tokenizers library to count tokens: "
                             "pip install 'pystub-backend[openai]'") from None
    try:
        return TokenizerCounter(Tokenizer.from_file(str(file)))
    except Exception as exc:  # noqa: BLE001 - the library raises its own exception types
        raise TokenizerError(f"{file} cannot be read by the tokenizers library: {exc}") from None
