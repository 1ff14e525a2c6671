"""A stand-in LLM for agents: see config.pbtxt. Replace `_answer_text` with a real model; the rest
(streaming, cancellation, max_tokens, logprobs) is what any decoupled LLM model does."""

import json
import re
import threading

import numpy as np
import triton_python_backend_utils as pb_utils

from stand_in import Words, guided, instance

_TURN = re.compile(r"<\|im_start\|>(\w+)\n(.*?)(?:<\|im_end\|>|$)", re.S)
_TOOLS = re.compile(r"<tools>\n(.*?)\n</tools>", re.S)
_RESULT = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.S)
_PIECE = re.compile(r"\s*\S{1,4}|\s+")  # the stand-in's "tokens"


def _input(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else tensor.as_numpy().reshape(-1)[0]


def _conversation(prompt):
    """The tools shown, the last user turn's text and the tool results in it (ChatML prompts)."""
    turns = _TURN.findall(prompt)
    tools_block = _TOOLS.search(prompt)
    tools = [json.loads(line)["function"] for line in tools_block.group(1).splitlines()] if tools_block else []
    users = [text for role, text in turns if role == "user"]
    last = users[-1] if users else prompt
    return tools, _RESULT.sub("", last).strip(), _RESULT.findall(last)


def _named_words(name):
    return [w.lower() for w in re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])", name) if len(w) >= 4]


def _calls(tools, message):
    """The tools the message names, with arguments drawn from it, in the order it names them."""
    lowered, words = message.lower(), Words(message)
    named = [(min(lowered.find(w) for w in _named_words(t["name"]) if w in lowered), t) for t in tools
             if any(w in lowered for w in _named_words(t["name"]))]
    return [{"name": tool["name"], "arguments": instance(tool.get("parameters") or {"type": "object"}, words)}
            for _, tool in sorted(named, key=lambda item: item[0])]


def _written(calls, style):
    """The calls as the model family `style` writes them (what --tool-call-parser reads)."""
    if style == "llama3":
        return "; ".join(json.dumps({"name": c["name"], "parameters": c["arguments"]}) for c in calls)
    if style == "mistral":
        return "[TOOL_CALLS]" + json.dumps(calls)
    return "\n".join(f"<tool_call>\n{json.dumps(call)}\n</tool_call>" for call in calls)


def _answer_text(prompt, sampling, style):
    tools, message, results = _conversation(prompt)
    if sampling.get("guided_decoding"):
        return guided(json.loads(sampling["guided_decoding"]), Words(message))
    if results:
        return "Here is what the tools returned: " + "; ".join(results) + "."
    calls = _calls(tools, message) if tools else []
    return _written(calls, style) if calls else f"You said: {message}"


def _logprobs(pieces, alternatives):
    def entry(piece):
        logprob = -round(0.1 * len(piece.strip()), 3)
        top = [{"token": piece, "logprob": logprob}] + \
            [{"token": f"<alt{k}>", "logprob": logprob - 1 - k} for k in range(max(alternatives - 1, 0))]
        return {"token": piece, "logprob": logprob, "top_logprobs": top[:alternatives]}
    return json.dumps([entry(piece) for piece in pieces]).encode()


def _response(pieces, alternatives):
    tensors = [pb_utils.Tensor("text_output", np.array(["".join(pieces).encode()], dtype=object))]
    if alternatives is not None:
        tensors.append(pb_utils.Tensor("logprobs", np.array([_logprobs(pieces, alternatives)], dtype=object)))
    return pb_utils.InferenceResponse(tensors)


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self._style = parameters.get("tool_call_format", {}).get("string_value", "hermes")

    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self._answer, args=(request,), daemon=True).start()
        return None

    def _answer(self, request):
        sender = request.get_response_sender()
        prompt = _input(request, "text_input", b"").decode()
        sampling = json.loads(_input(request, "sampling_parameters", b"{}"))
        stream = bool(_input(request, "stream", False))
        alternatives = sampling.get("logprobs")
        try:
            text = _answer_text(prompt, sampling, self._style)
        except ValueError as exc:
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))), flags=FINAL)
            return
        if not bool(_input(request, "exclude_input_in_output", True)):
            text = prompt + text
        pieces = _PIECE.findall(text)[:sampling.get("max_tokens") or None]
        sent = []
        for piece in pieces:
            if sender.is_cancelled():
                print(f"tool_llm: cancelled after {len(sent)} pieces", flush=True)
                break
            sent.append(piece)
            if stream:
                sender.send(_response([piece], alternatives))
        if not stream and not sender.is_cancelled():
            sender.send(_response(sent, alternatives))
        sender.send(flags=FINAL)


FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
