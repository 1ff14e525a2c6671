"""Tool calls parsed from a model's text, whole or as it streams (`--tool-call-parser`).

    pieces.py    Content and CallDelta, what every parser makes of the text; assemble() joins them
    scanner.py   one call written as a JSON object, read as its characters arrive
    hermes.py    <tool_call>{...}</tool_call>          (hermes, qwen)
    llama3.py    {"name": ..., "parameters": ...}; ...  (llama3, llama3_json)
    mistral.py   [TOOL_CALLS][{...}] and [TOOL_CALLS]name[ARGS]{...}   (mistral); the bare JSON list
    forced.py    a named tool_choice: the text is the arguments
"""

from __future__ import annotations

from collections.abc import Callable

from pystub_backend.backend.frontends.openai.tool_calls.forced import NamedCallParser
from pystub_backend.backend.frontends.openai.tool_calls.hermes import HermesParser
from pystub_backend.backend.frontends.openai.tool_calls.llama3 import Llama3JsonParser
from pystub_backend.backend.frontends.openai.tool_calls.mistral import JsonListParser, MistralParser
from pystub_backend.backend.frontends.openai.tool_calls.pieces import (
           Assembled,
           CallDelta,
           Content,
           Piece,
           ToolCall,
           ToolCallParser,
           assemble,
)

__all__ = ["PARSERS", "ToolCallParser", "Piece", "Content", "CallDelta", "ToolCall", "Assembled", "assemble",
           "NamedCallParser", "JsonListParser"]

# --tool-call-parser's names (vLLM's and Triton's frontend's where they have one) and the parser each makes
PARSERS: dict[str, Callable[[], ToolCallParser]] = {
    "hermes": HermesParser, "qwen": HermesParser,
    "llama3": Llama3JsonParser, "llama3_json": Llama3JsonParser,
    "mistral": MistralParser,
}
