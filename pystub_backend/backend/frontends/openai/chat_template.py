"""Chat messages to a prompt: a Jinja chat template, as Hugging Face tokenizers carry them.

Where the template comes from, first found wins (all local files; nothing is downloaded):

    --chat-template FILE_OR_TEXT   a Jinja file, or the template's text itself
    --tokenizer PATH               PATH/chat_template.jinja, or "chat_template" in
                                   PATH/tokenizer_config.json (PATH may name that file);
                                   its bos_token and eos_token are passed to the template
    neither                        DEFAULT_TEMPLATE (ChatML; tools as Qwen 2.5 and Hermes show them)

The template is compiled once at start-up in jinja2's immutable sandbox (as transformers'
`apply_chat_template` does), with `messages`, `add_generation_prompt=True`, `bos_token`,
`eos_token`, `tools` (the request's, as OpenAI's `{"type": "function", "function": {...}}`
objects, or None), `documents=None`, `raise_exception(text)` for templates that refuse a
conversation, `strftime_now(format)` and transformers' `tojson` (no HTML escaping), as
transformers gives them. The calls in the history come with their arguments as objects.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

from pystub_backend.backend.options import OpenAIOptions

__all__ = ["ChatTemplate", "ChatTemplateError", "load_chat_template", "DEFAULT_TEMPLATE"]

# ChatML; with tools, the system turn lists them and calls and results are written as Qwen 2.5's
# template writes them (<tool_call> JSON, <tool_response> in a user turn), which the hermes parser reads.
DEFAULT_TEMPLATE = r"""
{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\n\n' }}{%- endif %}
{{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function '
    'signatures within <tools></tools> XML tags:\n<tools>' }}
{%- for tool in tools %}{{- '\n' + (tool | tojson) }}{%- endfor %}
{{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within '
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    '</tool_call><|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message['role'] == 'system' and tools and loop.first %}
{%- elif message['role'] == 'assistant' and message['tool_calls'] is defined and message['tool_calls'] %}
{{- '<|im_start|>assistant' }}
{%- if message['content'] %}{{- '\n' + message['content'] }}{%- endif %}
{%- for call in message['tool_calls'] %}
{%- set function = call['function'] if call['function'] is defined else call %}
{{- '\n<tool_call>\n{"name": "' + function['name'] + '", "arguments": ' + (function['arguments'] | tojson)
    + '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif message['role'] == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\n<tool_response>\n' + message['content'] + '\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}
{%- else %}
{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
"""


class ChatTemplateError(Exception):
    """The template cannot be found, read or compiled (a start-up error)."""


class ChatTemplate:
    """A compiled template; `render(messages)` is the prompt. Raises what the template raises."""

    def __init__(self, source: str, origin: str, special_tokens: dict[str, str] | None = None) -> None:
        try:
            from jinja2 import TemplateError
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError:
            raise ChatTemplateError("the OpenAI-compatible API needs jinja2 for chat templates: "
                                    "pip install 'pystub-backend[openai]'") from None
        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        environment.globals["raise_exception"] = _raise_exception
        environment.globals["strftime_now"] = _strftime_now  # Llama 3.x templates date their system prompt
        environment.filters["tojson"] = _tojson
        try:
            self._template = environment.from_string(source)
        except TemplateError as exc:
            raise ChatTemplateError(f"the chat template of {origin} does not compile: {exc}") from None
        self.origin = origin
        self._tokens = dict(special_tokens or {})

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        # tools and documents None as transformers passes them when a request has none: templates
        # test `tools is not none`, which an undefined name would pass
        return self._template.render(messages=messages, add_generation_prompt=True, tools=tools or None,
                                     documents=None, **self._tokens)


def _raise_exception(message: str) -> None:
    raise ValueError(message)


def _tojson(value: object, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """transformers' tojson: plain JSON (jinja2's own escapes <, > and & for HTML)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format_text: str) -> str:
    return datetime.datetime.now().strftime(format_text)


def load_chat_template(options: OpenAIOptions) -> ChatTemplate:
    """The template the options name. Raises ChatTemplateError."""
    tokens: dict[str, str] = {}
    source, origin = None, "the default (ChatML)"
    if options.tokenizer:
        source, tokens = _from_tokenizer(Path(options.tokenizer))
        origin = f"--tokenizer {options.tokenizer}"
    if options.chat_template:
        source, origin = _given_template(options.chat_template), "--chat-template"
    if source is None:
        if options.tokenizer:
            raise ChatTemplateError(f"--tokenizer {options.tokenizer}: no chat_template.jinja and no "
                                    "'chat_template' in tokenizer_config.json (give one with --chat-template)")
        source = DEFAULT_TEMPLATE
    return ChatTemplate(source, origin, tokens)


def _given_template(value: str) -> str:
    path = Path(value)
    if "\n" not in value and "{" not in value:
        if not path.is_file():
            raise ChatTemplateError(f"--chat-template {value}: no such file (nor is it a Jinja template)")
        return _read(path)
    return value


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ChatTemplateError(f"cannot read {path}: {exc}") from None


def _from_tokenizer(path: Path) -> tuple[str | None, dict[str, str]]:
    """The template and special tokens of a tokenizer directory (or its tokenizer_config.json)."""
    directory, config_path = (path.parent, path) if path.is_file() else (path, path / "tokenizer_config.json")
    if not directory.is_dir():
        raise ChatTemplateError(f"--tokenizer {path}: no such directory")
    config: dict[str, Any] = {}
    if config_path.is_file():
        try:
            config = json.loads(_read(config_path))
        except ValueError as exc:
            raise ChatTemplateError(f"{config_path} is not JSON: {exc}") from None
    tokens = {name: _token_text(config.get(name)) for name in ("bos_token", "eos_token")}
    template_file = directory / "chat_template.jinja"
    if template_file.is_file():
        return _read(template_file), tokens
    return _config_template(config.get("chat_template"), config_path), tokens


def _config_template(value: Any, origin: Path) -> str | None:
    """tokenizer_config.json's chat_template: a string, or named templates (the "default" one)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {item.get("name"): item.get("template") for item in value if isinstance(item, dict)}
        if isinstance(named.get("default"), str):
            return named["default"]
    raise ChatTemplateError(f"{origin}: 'chat_template' is neither a string nor a list holding a 'default' template")


def _token_text(token: Any) -> str:
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) else ""
