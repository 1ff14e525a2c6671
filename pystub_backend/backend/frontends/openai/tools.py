"""`tools`, `tool_choice` and `parallel_tool_calls` of a chat request, checked, and what they ask:

    tool_choice  "none"       the tools are not shown to the model and nothing is parsed
                 "auto"       (the default with tools) shown to the model (the chat template's
                              `tools`); calls parsed from its text by the tool-call parser
                 "required"   the model is guided to a JSON list of calls, [{"name", "parameters"}],
                              by the schema vLLM uses, when it declares structured outputs;
                              else, as "auto"
                 {"type": "function", "function": {"name": N}}
                              the model is guided to N's parameters, its text the arguments of a
                              call to N, when it declares structured outputs; else, as "auto"

`parallel_tool_calls: false` keeps the first call of an answer (and, guided, asks for a list of
one). The legacy `functions` / `function_call` are refused: OpenAI replaced them with these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pystub_backend.backend.frontends.openai.errors import invalid

__all__ = ["ToolRequest", "tool_request", "NONE", "AUTO", "REQUIRED", "NAMED"]

NONE, AUTO, REQUIRED, NAMED = "none", "auto", "required", "named"
_EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolRequest:
    tools: list[dict[str, Any]]  # as the request gave them: the chat template's `tools`
    choice: str  # NONE, AUTO, REQUIRED or NAMED
    function: str | None = None  # NAMED: the function's name
    parallel: bool = True

    def parameters(self, name: str) -> dict[str, Any]:
        function = next(tool["function"] for tool in self.tools if tool["function"]["name"] == name)
        return function.get("parameters") or _EMPTY_PARAMETERS

    def guide_schema(self) -> dict[str, Any]:
        """The JSON schema a guided model follows: the named function's parameters, or (required)
        a list of calls, as vLLM guides it."""
        if self.choice == NAMED:
            assert self.function is not None
            return self.parameters(self.function)
        calls = [{"properties": {"name": {"type": "string", "enum": [tool["function"]["name"]]},
                                 "parameters": self.parameters(tool["function"]["name"])},
                  "required": ["name", "parameters"]} for tool in self.tools]
        schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": calls}}
        if not self.parallel:
            schema["maxItems"] = 1
        return schema


def _tool(tool: object, index: int) -> str:
    param = f"tools[{index}]"
    function = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(function, dict):
        raise invalid(f"{param} must be {{\"type\": \"function\", \"function\": {{...}}}}", param)
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise invalid(f"{param}.function.name must be a non-empty string", f"{param}.function.name")
    if function.get("parameters") is not None and not isinstance(function["parameters"], dict):
        raise invalid(f"{param}.function.parameters must be a JSON schema object", f"{param}.function.parameters")
    return name


def _choice(value: object, names: list[str]) -> tuple[str, str | None]:
    if value is None:
        return (AUTO if names else NONE), None
    if value in (NONE, AUTO, REQUIRED):
        if value != NONE and not names:
            raise invalid(f"'tool_choice' {value!r} needs 'tools'", "tool_choice")
        return value, None
    function = value.get("function") if isinstance(value, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise invalid("'tool_choice' must be 'none', 'auto', 'required' or "
                      "{\"type\": \"function\", \"function\": {\"name\": ...}}", "tool_choice")
    if name not in names:
        raise invalid(f"'tool_choice' names the function {name!r}, which is not among 'tools'", "tool_choice")
    return NAMED, name


def tool_request(document: dict[str, Any]) -> ToolRequest | None:
    """The request's tools and choice; None without tools or with tool_choice "none". Raises OpenAIError(400)."""
    for legacy in ("functions", "function_call"):
        if document.get(legacy) is not None:
            raise invalid(f"'{legacy}' is deprecated by OpenAI and not served here: send 'tools' and 'tool_choice'",
                          legacy)
    tools = document.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise invalid("'tools' must be a list", "tools")
    names = [_tool(tool, index) for index, tool in enumerate(tools or [])]
    choice, function = _choice(document.get("tool_choice"), names)
    parallel = document.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise invalid("'parallel_tool_calls' must be a boolean", "parallel_tool_calls")
    if choice == NONE:
        return None
    return ToolRequest(list(tools or []), choice, function, parallel is not False)
