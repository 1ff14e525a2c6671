"""What the OpenAI port does to a model's text before the client sees it: stop strings cut it (a
partial one held back across responses, whatever the split), a choice parses its tool calls and
keeps the logprobs of the text it lets through, and the tokenizer counts (a tokenizer built here
with the `tokenizers` library)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from pystub_backend.backend.frontends.openai.choice import Choice
from pystub_backend.backend.frontends.openai.errors import OpenAIError
from pystub_backend.backend.frontends.openai.logprobs import TokenLogprob, chat_logprobs, parse_logprobs
from pystub_backend.backend.frontends.openai.marks import partial_suffix
from pystub_backend.backend.frontends.openai.stop import StopFilter
from pystub_backend.backend.frontends.openai.tokens import (
    TokenizerCounter,
    TokenizerError,
    WordCounter,
    load_token_counter,
)
from pystub_backend.backend.frontends.openai.tool_calls import PARSERS
from pystub_backend.backend.inference import InferResponse, Tensor
from pystub_backend.ipc.bytes_codec import serialize_bytes


def test_partial_suffix() -> None:
    assert [partial_suffix(text, "<tool_call>") for text in ("a <to", "a <", "a", "<tool_call", "x<t<")] == \
        [3, 1, 0, 10, 1]


def cut(stops: list[str], pieces: list[str], include: bool = False, skip: int = 0) -> tuple[list[str], bool]:
    stop = StopFilter(stops, include, skip)
    out = [stop.feed(piece) for piece in pieces]
    return [*out, stop.finish()], stop.stopped


def test_stop_cuts_at_the_first_stop_string_in_any_split() -> None:
    text = "alpha beta END gamma STOP"
    for seed in range(50):
        chooser, pieces, start = random.Random(seed), [], 0
        while start < len(text):
            size = chooser.randint(1, 6)
            pieces.append(text[start:start + size])
            start += size
        out, stopped = cut(["STOP", "END"], pieces)
        assert "".join(out) == "alpha beta " and stopped, pieces
    assert cut(["END"], ["a E", "N", "x"]) == (["a ", "", "ENx", ""], False)  # "EN" held, then released
    assert cut(["END"], ["aEN", "Db"], include=True) == (["a", "END", ""], True)
    assert cut(["END"], ["END", "x END"], skip=3) == (["END", "x ", ""], True)  # an echoed prompt is not examined
    assert cut(["ab", "b"], ["xab"]) == (["x", ""], True)  # the earliest, whichever stop it is


def _response(text: str, logprobs: bytes | None = None) -> InferResponse:
    outputs = [Tensor("text_output", "BYTES", (1,), serialize_bytes([text.encode()]))]
    if logprobs is not None:
        outputs.append(Tensor("logprobs", "BYTES", (1,), serialize_bytes([logprobs])))
    return InferResponse("m", "1", "id", outputs)


def _entries(*tokens: str) -> bytes:
    import json

    return json.dumps([{"token": t, "logprob": -1.0, "top_logprobs": [{"token": t, "logprob": -1.0}]}
                       for t in tokens]).encode()


def test_a_choice_cuts_parses_and_keeps_the_logprobs_of_what_it_lets_through() -> None:
    choice = Choice(0, "m", StopFilter(["</s>"]), PARSERS["hermes"](), logprobs=True)
    steps = [choice.take(_response(text, _entries(text))) for text in
             ("Hi <tool_", 'call>{"name": "f", "arguments": {"a": 1}}</tool_call>', "</s> more")]
    steps.append(choice.finish())
    assert choice.assembled.content == "Hi " and [(c.name, c.arguments) for c in choice.assembled.calls] == \
        [("f", '{"a": 1}')]
    assert choice.stopped and choice.finish_reason(9, 100) == "tool_calls"
    assert [e.token for e in choice.logprobs] == ["Hi <tool_", 'call>{"name": "f", "arguments": {"a": 1}}</tool_call>']
    plain = Choice(1, "m", parser=None, parallel=True)
    plain.take(_response("abc"))
    assert plain.finish_reason(4, 4) == "length" and plain.finish_reason(3, 4) == "stop"


def test_parallel_tool_calls_false_keeps_the_first_call() -> None:
    choice = Choice(0, "m", parser=PARSERS["llama3"](), parallel=False)
    choice.take(_response('{"name": "a", "parameters": {}}; {"name": "b", "parameters": {}}'))
    choice.finish()
    assert [call.name for call in choice.assembled.calls] == ["a"]


def test_logprobs_off_contract_are_a_500_naming_the_model() -> None:
    with pytest.raises(OpenAIError, match="model 'm' sent a 'logprobs' output") as caught:
        parse_logprobs("m", b'{"not": "a list"}')
    assert caught.value.status == 500
    assert chat_logprobs([TokenLogprob("é", -0.5, (("é", -0.5),))])["content"][0]["bytes"] == [195, 169]


def _tokenizer_directory(directory: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(["hello there , friend"], trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory


def test_token_counter_from_a_tokenizer_directory(tmp_path: Path) -> None:
    counter = load_token_counter(str(_tokenizer_directory(tmp_path)))
    assert isinstance(counter, TokenizerCounter) and counter.exact
    assert counter.count("hello there, friend") == 4 and WordCounter().count("hello there, friend") == 3
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(tmp_path / "tokenizer.json")).encode("friend hello").ids
    assert counter.decode(ids) == "friend hello"
    with pytest.raises(OpenAIError, match="not in the tokenizer's vocabulary"):
        counter.decode([99])
    assert isinstance(load_token_counter(""), WordCounter)
    assert isinstance(load_token_counter(str(tmp_path / "tokenizer.json")), TokenizerCounter)  # the file itself
    (tmp_path / "empty").mkdir()
    assert isinstance(load_token_counter(str(tmp_path / "empty")), WordCounter)  # no tokenizer.json: words
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "tokenizer.json").write_text("{}")
    with pytest.raises(TokenizerError, match="cannot be read"):
        load_token_counter(str(tmp_path / "broken"))
    with pytest.raises(OpenAIError, match="need a tokenizer"):
        WordCounter().decode([1])
