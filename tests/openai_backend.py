"""Backends serving the OpenAI-compatible port for the tests/integration/test_openai_*.py modules.

`openai_backend`: the mock LLM (tests/models/openai_echo), the same model batched with dims [1, 1]
and an INT32 `max_tokens` input, a small embedding model written here, and add_sub (off contract),
behind the restricted group "openai" (the client's API key is the header), traced to a local OTLP
collector, with a tokenizer directory whose chat template the chat tests see.

`agent_backend`: the example models of examples/openai_models (tool_llm calls tools and follows
guided decoding), tool_llm again writing Llama 3 and Mistral calls, a Matryoshka variant of the
example embedding, with a tokenizer this module builds with the `tokenizers` library (nothing is
downloaded), the default chat template, CORS for one origin and a context length by flag."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
from harness import ROOT, Backend, make_repository, module_backend
from otlp_collector import Collector

from pystub_backend.backend.frontends.openai.chat_template import DEFAULT_TEMPLATE

API_KEY = "sekrit"
TEMPLATE = ("{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}[assistant]{% endif %}")

_EMBEDDING_CONFIG = """backend: "python"
max_batch_size: 8
dynamic_batching { max_queue_delay_microseconds: 2000 }
input [ { name: "text_input", data_type: TYPE_STRING, dims: [ 1 ] } ]
output [ { name: "embedding", data_type: TYPE_FP32, dims: [ 3 ] } ]
"""
# The embedding of a text: [characters, words, 0.5], so a test knows every vector.
_EMBEDDING_MODEL = '''import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            texts = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)
            vectors = np.array([[len(t.decode()), len(t.split()), 0.5] for t in texts], dtype=np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("embedding", vectors)]))
        return responses
'''


def expected_embedding(text: str) -> list[float]:
    return [float(len(text)), float(len(text.split())), 0.5]


_COUNTS_IN = """
  { name: "return_num_input_tokens", data_type: TYPE_BOOL, dims: [ 1 ], optional: true },
  { name: "return_num_output_tokens", data_type: TYPE_BOOL, dims: [ 1 ], optional: true },"""
_COUNTS_OUT = """output [
  { name: "num_input_tokens", data_type: TYPE_UINT32, dims: [ 1 ] },
  { name: "num_output_tokens", data_type: TYPE_UINT32, dims: [ 1 ] },"""


def _batched_config(source: str) -> str:
    """openai_echo with max_batch_size 4 (inputs [1, 1]), max_tokens as an INT32 input, no
    sampling_parameters, and vLLM's token counts."""
    config = source.replace("max_batch_size: 0", "max_batch_size: 4")
    config = re.sub(r"\s*\{ name: \"sampling_parameters\"[^}]*\},", _COUNTS_IN, config)
    return config.replace("output [", _COUNTS_OUT, 1)


def _repository(directory: Path) -> Path:
    repository = make_repository(directory, "openai_echo", "add_sub")
    batched = repository / "openai_echo_batched"
    shutil.copytree(repository / "openai_echo", batched)
    (batched / "config.pbtxt").write_text(_batched_config((batched / "config.pbtxt").read_text()))
    (repository / "embedder" / "1").mkdir(parents=True)
    (repository / "embedder" / "config.pbtxt").write_text(_EMBEDDING_CONFIG)
    (repository / "embedder" / "1" / "model.py").write_text(_EMBEDDING_MODEL)
    tokenizer = directory / "tokenizer"
    tokenizer.mkdir()
    (tokenizer / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE, "bos_token": "<s>"}))
    return repository


@contextlib.contextmanager
def openai_backend(directory: Path) -> Iterator[tuple[Backend, Collector]]:
    repository = _repository(directory)
    with Collector() as collector:
        backend = Backend(repository, "--openai-port", "0", "--tokenizer", str(directory / "tokenizer"),
                          "--http-restricted-api", f"openai:authorization=Bearer {API_KEY}", "--log-verbose", "1",
                          "--trace-config", "mode=opentelemetry", "--trace-config", "rate=1",
                          "--trace-config", "opentelemetry,bsp_schedule_delay=50", "--trace-config", "level=TIMESTAMPS",
                          "--trace-config", f"opentelemetry,url={collector.url}")
        with module_backend(backend):
            yield backend, collector


def client(backend: Backend, **kwargs: object) -> openai.OpenAI:
    return openai.OpenAI(base_url=backend.openai_url, api_key=API_KEY, max_retries=0, timeout=60, **kwargs)


def raw(backend: Backend) -> httpx.Client:
    """An httpx client for the raw bodies, with the API key."""
    return httpx.Client(base_url=backend.openai_url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60)


ORIGIN = "https://app.example"
CONTEXT_FLAG = 512  # --max-model-len: echo_llm declares none (tool_llm declares 8192)
SPECIAL_TOKENS = ["<s>", "<|im_start|>", "<|im_end|>", "[UNK]"]
_CORPUS = ["the quick brown fox jumps over the lazy dog", "hello there , how are you ?", "user assistant system"]


def build_tokenizer(directory: Path) -> Path:
    """A word-level tokenizer (words and punctuation apart, ChatML's markers one token each, a BOS
    added to completion prompts) trained on a few sentences, saved as tokenizer.json with the
    default chat template in tokenizer_config.json."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(_CORPUS, trainers.WordLevelTrainer(special_tokens=SPECIAL_TOKENS))
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[
        ("<s>", tokenizer.token_to_id("<s>"))])
    directory.mkdir(parents=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"chat_template": DEFAULT_TEMPLATE}))
    return directory


def _variant(repository: Path, source: str, name: str, replacements: dict[str, str]) -> None:
    shutil.copytree(repository / source, repository / name)
    config = (repository / name / "config.pbtxt").read_text()
    for old, new in replacements.items():
        assert old in config, (name, old)
        config = config.replace(old, new)
    (repository / name / "config.pbtxt").write_text(config)


def _agent_repository(directory: Path) -> Path:
    repository = directory / "models"
    shutil.copytree(ROOT / "examples" / "openai_models", repository)
    for style in ("llama3", "mistral"):
        _variant(repository, "tool_llm", f"tool_llm_{style}", {'string_value: "hermes"': f'string_value: "{style}"'})
    _variant(repository, "word_embedding", "matryoshka_embedding", {
        "dynamic_batching": 'parameters [ { key: "matryoshka", value: { string_value: "true" } } ]\ndynamic_batching'})
    return repository


@contextlib.contextmanager
def agent_backend(directory: Path) -> Iterator[Backend]:
    tokenizer = build_tokenizer(directory / "tokenizer")
    backend = Backend(_agent_repository(directory), "--openai-port", "0", "--tokenizer", str(tokenizer),
                      "--http-restricted-api", f"openai:authorization=Bearer {API_KEY}",
                      "--openai-cors-origin", ORIGIN, "--max-model-len", str(CONTEXT_FLAG))
    with module_backend(backend):
        yield backend
