"""What the OpenAI port is set up with at start-up (`load_openai_serving`), read once: the chat
template, the token counter (a tokenizer, or words), the tool-call parser, the context length of
models that declare none, and the origins browsers may call from."""

from __future__ import annotations

from dataclasses import dataclass

from pystub_backend.backend.frontends.openai.chat_template import ChatTemplate, ChatTemplateError, load_chat_template
from pystub_backend.backend.frontends.openai.tokens import TokenCounter, TokenizerError, WordCounter, load_token_counter
from pystub_backend.backend.options import OpenAIOptions

__all__ = ["OpenAIServing", "OpenAISetupError", "load_openai_serving"]


class OpenAISetupError(Exception):
    """The port cannot be set up as its flags say (a start-up error)."""


@dataclass(frozen=True)
class OpenAIServing:
    template: ChatTemplate
    counter: TokenCounter = WordCounter()
    tool_call_parser: str = ""  # --tool-call-parser; "" parses no tool calls for models that name none
    max_model_len: int | None = None
    cors_origins: tuple[str, ...] = ()


def load_openai_serving(options: OpenAIOptions) -> OpenAIServing:
    """Raises OpenAISetupError naming what cannot be read."""
    try:
        template = load_chat_template(options)
        counter = load_token_counter(options.tokenizer)
    except (ChatTemplateError, TokenizerError) as exc:
        raise OpenAISetupError(str(exc)) from None
    return OpenAIServing(template, counter, options.tool_call_parser, options.max_model_len, options.cors_origins)
