"""What a generation request asks of its model, decided before the model runs, so that every
refusal comes before the first byte of the answer:

    the prompts      token ids decoded with the tokenizer
    the context      prompt + max_tokens within the model's length (its config's max_model_len,
                     else --max-model-len), else 400 context_length_exceeded
    guided decoding  response_format / guided_* (structured.py), or the schema of a "required" or
                     named tool_choice, for a model that declares structured outputs, else 400
    tool calls       the parser (the model's tool_call_parser, else --tool-call-parser): auto needs one
    logprobs         only from a model that has the output

`Plan.request(i)` is the model's request for choice i (prompt i // n; with a `seed`, choice j of a
prompt gets seed + j, so that n choices differ as OpenAI's do); `Plan.choice(i)` reads its text.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pystub_backend.backend.frontends.openai.choice import Choice
from pystub_backend.backend.frontends.openai.contract import LlmContract
from pystub_backend.backend.frontends.openai.documents import Usage
from pystub_backend.backend.frontends.openai.errors import OpenAIError, invalid
from pystub_backend.backend.frontends.openai.request_body import GenerationRequest
from pystub_backend.backend.frontends.openai.stop import StopFilter
from pystub_backend.backend.frontends.openai.structured import SAMPLING_KEY, Guide
from pystub_backend.backend.frontends.openai.tokens import TokenCounter
from pystub_backend.backend.frontends.openai.tool_calls import PARSERS, JsonListParser, NamedCallParser, ToolCallParser
from pystub_backend.backend.frontends.openai.tools import NAMED, REQUIRED, ToolRequest
from pystub_backend.backend.inference import InferRequest

__all__ = ["Plan", "plan", "count_tokens"]

_THREAD_ABOVE = 16 * 1024  # characters: a longer text is tokenized off the event loop


async def count_tokens(counter: TokenCounter, text: str, special_tokens: bool = False) -> int:
    if counter.exact and len(text) > _THREAD_ABOVE:
        return await asyncio.to_thread(counter.count, text, special_tokens)
    return counter.count(text, special_tokens)


@dataclass
class Plan:
    contract: LlmContract
    generation: GenerationRequest
    prompts: list[str]
    sampling: dict[str, Any]
    counter: TokenCounter
    parser: Callable[[], ToolCallParser] | None = None
    prompt_counts: list[int | None] = field(default_factory=list)

    @property
    def size(self) -> int:
        return len(self.prompts) * self.generation.n

    def request(self, index: int, response_id: str) -> InferRequest:
        n = self.generation.n
        sampling = self.sampling
        if index % n and isinstance(sampling.get("seed"), int):
            sampling = {**sampling, "seed": sampling["seed"] + index % n}
        request_id = response_id if self.size == 1 else f"{response_id}-{index}"
        return self.contract.request(self.prompts[index // n], self.generation, sampling, request_id)

    def choice(self, index: int) -> Choice:
        generation = self.generation
        stop = None
        if generation.stop:
            echoed = len(self.prompts[index // generation.n]) if generation.echo else 0
            stop = StopFilter(generation.stop, generation.include_stop, echoed)
        tools = generation.tools
        return Choice(index, generation.model, stop, self.parser() if self.parser is not None else None,
                      tools is None or tools.parallel, generation.logprobs is not None)

    async def finish_reason(self, choice: Choice) -> str:
        """Its finish_reason; the text is counted only where it may have reached max_tokens."""
        if self.generation.max_tokens is None or choice.assembled.calls or choice.stopped:
            return choice.finish_reason(0, None)
        return choice.finish_reason(await self.completion_tokens(choice), self.generation.max_tokens)

    async def completion_tokens(self, choice: Choice) -> int:
        if choice.completion_tokens is not None:
            return choice.completion_tokens
        return await count_tokens(self.counter, "".join(choice.text))

    async def usage(self, choices: list[Choice]) -> Usage:
        """Prompt tokens once a prompt (not once a choice, as OpenAI counts), completion tokens of every choice."""
        n, prompt_tokens = self.generation.n, 0
        for index in range(len(self.prompts)):
            reported = choices[index * n].prompt_tokens
            prompt_tokens += reported if reported is not None else await self.prompt_count(index)
        completion = sum([await self.completion_tokens(choice) for choice in choices])
        return Usage(prompt_tokens, completion)

    async def prompt_count(self, index: int) -> int:
        """Prompt `index` in tokens (words without a tokenizer), counted once."""
        if self.prompt_counts[index] is None:
            generation = self.generation
            if generation.chat and not self.counter.exact and generation.counted_text is not None:
                text = generation.counted_text  # words of the messages, not of the template's markers
            else:
                text = self.prompts[index]
            self.prompt_counts[index] = await count_tokens(self.counter, text, special_tokens=not generation.chat)
        count = self.prompt_counts[index]
        assert count is not None
        return count


def _guide(contract: LlmContract, generation: GenerationRequest) -> Guide | None:
    guide, tools = generation.guide, generation.tools
    if tools is not None and tools.choice in (REQUIRED, NAMED) and contract.structured_outputs:
        if guide is not None:
            raise invalid(f"'{guide.param}' cannot be combined with a tool_choice of {tools.choice!r}: both "
                          "guide the model's text", guide.param)
        return Guide({"json": tools.guide_schema()}, "tool_choice")
    if guide is not None and not contract.structured_outputs:
        raise invalid(f"model '{contract.model}' does not declare structured outputs, so '{guide.param}' cannot be "
                      "honoured: its config needs parameters { key: \"structured_outputs\" value: { string_value: "
                      "\"true\" } } (and a model that follows guided_decoding; see docs/openai.md)", guide.param)
    if guide is not None and "sampling_parameters" not in contract.inputs:
        raise invalid(f"model '{contract.model}' declares structured outputs but no 'sampling_parameters' input "
                      "to receive them", guide.param)
    return guide


def _parser(contract: LlmContract, tools: ToolRequest | None, default: str, guided: bool
            ) -> Callable[[], ToolCallParser] | None:
    if tools is None:
        return None
    if guided:
        function = tools.function
        if function is not None:
            return lambda: NamedCallParser(function)
        return JsonListParser
    name = contract.tool_call_parser or default
    if not name:
        raise invalid(f"tool calls of model '{contract.model}' cannot be read: start the server with "
                      "--tool-call-parser (hermes, llama3 or mistral), or give the model's config a tool_call_parser "
                      "parameter" + ("" if tools.choice == "auto" else ", or declare structured outputs"),
                      "tool_choice" if tools.choice != "auto" else "tools")
    if name not in PARSERS:
        raise OpenAIError(500, f"model '{contract.model}' names tool_call_parser {name!r}: not one of "
                               f"{', '.join(sorted(PARSERS))}")
    return PARSERS[name]


def _prompts(generation: GenerationRequest, counter: TokenCounter) -> list[str]:
    return [prompt if isinstance(prompt, str) else counter.decode(prompt) for prompt in generation.prompts]


async def _check_context(plan: Plan, limit: int | None) -> None:
    if limit is None:
        return
    wanted = plan.generation.max_tokens or 0
    for index in range(len(plan.prompts)):
        tokens = await plan.prompt_count(index)
        if tokens + max(wanted, 1) > limit:
            asked = (f"you requested {tokens + wanted} tokens ({tokens} in the "
                     f"{'messages' if plan.generation.chat else 'prompt'}, {wanted} in the completion)" if wanted
                     else f"your {'messages' if plan.generation.chat else 'prompt'} resulted in {tokens} tokens")
            raise OpenAIError(400, f"This model's maximum context length is {limit} tokens. However, {asked}. "
                                   "Please reduce the length of the messages or completion.",
                              "messages" if plan.generation.chat else "prompt", "context_length_exceeded")


async def plan(contract: LlmContract, generation: GenerationRequest, counter: TokenCounter, default_parser: str,
               max_model_len: int | None) -> Plan:
    """Raises OpenAIError (400) for what the model cannot be asked."""
    if generation.logprobs is not None and not contract.logprobs:
        raise invalid(f"model '{contract.model}' does not return logprobs (it has no 'logprobs' output; see "
                      "docs/openai.md)", "top_logprobs" if generation.chat else "logprobs")
    guide = _guide(contract, generation)
    sampling = generation.sampling if guide is None else {**generation.sampling, SAMPLING_KEY: guide.sampling_value()}
    parser = _parser(contract, generation.tools, default_parser, guide is not None and guide.param == "tool_choice")
    prompts = _prompts(generation, counter)
    result = Plan(contract, generation, prompts, sampling, counter, parser, [None] * len(prompts))
    await _check_context(result, contract.max_model_len or max_model_len)
    return result
