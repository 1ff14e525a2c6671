"""Chat templates of the OpenAI port: from a tokenizer directory, a file, the command line, or
the default; refused at start-up when they cannot load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pystub_backend.backend.frontends.openai import ChatTemplateError, load_chat_template
from pystub_backend.backend.options import OpenAIOptions

MESSAGES = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]


def test_default_is_chatml() -> None:
    rendered = load_chat_template(OpenAIOptions()).render(MESSAGES)
    assert rendered == "<|im_start|>system\ns<|im_end|>\n<|im_start|>user\nu<|im_end|>\n<|im_start|>assistant\n"


def test_tokenizer_config_template_with_special_tokens(tmp_path: Path) -> None:
    config = {"chat_template": "{{ bos_token }}{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}",
              "bos_token": {"content": "<s>"}, "eos_token": "</s>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    assert load_chat_template(OpenAIOptions(tokenizer=str(tmp_path))).render(MESSAGES) == "<s>system:s;user:u;"
    # the file itself may be named, and a list of named templates picks "default"
    config["chat_template"] = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    template = load_chat_template(OpenAIOptions(tokenizer=str(tmp_path / "tokenizer_config.json")))
    assert template.render(MESSAGES) == "D"


def test_chat_template_jinja_file_wins_in_the_directory(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "config"}))
    (tmp_path / "chat_template.jinja").write_text("file")
    assert load_chat_template(OpenAIOptions(tokenizer=str(tmp_path))).render(MESSAGES) == "file"


def test_command_line_template_file_or_text_overrides_the_tokenizer(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "config", "bos_token": "B"}))
    template_file = tmp_path / "t.jinja"
    template_file.write_text("{{ bos_token }}{{ messages | length }}")
    chosen = OpenAIOptions(tokenizer=str(tmp_path), chat_template=str(template_file))
    assert load_chat_template(chosen).render(MESSAGES) == "B2"
    assert load_chat_template(OpenAIOptions(chat_template="{{ messages[-1].content }}!")).render(MESSAGES) == "u!"


def test_template_may_refuse_a_conversation() -> None:
    template = load_chat_template(OpenAIOptions(chat_template="{{ raise_exception('no system role') }}"))
    with pytest.raises(ValueError, match="no system role"):
        template.render(MESSAGES)


def test_sandbox_keeps_templates_from_python_internals() -> None:
    template = load_chat_template(OpenAIOptions(chat_template="{{ messages.__class__.__mro__ }}"))
    with pytest.raises(Exception, match="unsafe|access"):
        template.render(MESSAGES)


@pytest.mark.parametrize(("options", "message"), [
    (OpenAIOptions(chat_template="/no/such/template.jinja"), "no such file"),
    (OpenAIOptions(chat_template="{% for %}"), "does not compile"),
    (OpenAIOptions(tokenizer="/no/such/tokenizer"), "no such directory"),
])
def test_start_up_errors(options: OpenAIOptions, message: str) -> None:
    with pytest.raises(ChatTemplateError, match=message):
        load_chat_template(options)


def test_tokenizer_without_a_template_is_refused(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>"}))
    with pytest.raises(ChatTemplateError, match="--chat-template"):
        load_chat_template(OpenAIOptions(tokenizer=str(tmp_path)))


def test_hugging_face_template_helpers() -> None:
    source = "{% if tools is not none %}tools{% endif %}{{ strftime_now('%Y') | length }}"
    assert load_chat_template(OpenAIOptions(chat_template=source)).render(MESSAGES) == "4"


def test_the_default_template_shows_tools_as_qwen_does_and_chatml_without() -> None:
    from pystub_backend.backend.frontends.openai.chat_template import DEFAULT_TEMPLATE, ChatTemplate

    template = ChatTemplate(DEFAULT_TEMPLATE, "the default")
    plain = template.render([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}])
    assert plain == "<|im_start|>system\ns<|im_end|>\n<|im_start|>user\nu<|im_end|>\n<|im_start|>assistant\n"
    tool = {"type": "function", "function": {"name": "f", "description": "a <b> & c", "parameters": {}}}
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"x": "é"}}}
    prompt = template.render([{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                              {"role": "assistant", "content": "", "tool_calls": [call]},
                              {"role": "tool", "tool_call_id": "c1", "content": "r1"},
                              {"role": "tool", "tool_call_id": "c2", "content": "r2"}], [tool])
    assert prompt.startswith("<|im_start|>system\ns\n\n# Tools\n")
    assert '<tools>\n{"type": "function", "function": {"name": "f", "description": "a <b> & c"' in prompt  # tojson
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "f", "arguments": {"x": "é"}}\n</tool_call><|im_end|>' \
        in prompt
    assert prompt.endswith("<|im_start|>user\n<tool_response>\nr1\n</tool_response>\n<tool_response>\nr2\n"
                           "</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert prompt.count("<|im_start|>system") == 1
