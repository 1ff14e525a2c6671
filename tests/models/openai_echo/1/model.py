"""The OpenAI port's mock LLM: see config.pbtxt. Each request runs as a task on the instance's
event loop, so a hundred streams share one stub."""

import asyncio
import json
import re

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _value(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    value = tensor.as_numpy().reshape(-1)[0]
    return value.decode() if isinstance(value, bytes) else value.item()


def _response(words, counts):
    """One response; with `counts` (the prompt's words, when asked for) vLLM's token counts too."""
    tensors = [pb_utils.Tensor("text_output", np.array(["".join(words).encode()], dtype=object))]
    if counts is not None:
        tensors += [pb_utils.Tensor("num_input_tokens", np.array([counts], dtype=np.uint32)),
                    pb_utils.Tensor("num_output_tokens", np.array([len(words)], dtype=np.uint32))]
    return pb_utils.InferenceResponse(tensors)


class TritonPythonModel:
    def initialize(self, args):
        self._tasks = set()

    async def execute(self, requests):
        for request in requests:
            task = asyncio.ensure_future(self._generate(request))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return None

    async def _generate(self, request):
        sender = request.get_response_sender()
        prompt = _value(request, "text_input", "")
        sampling = json.loads(_value(request, "sampling_parameters", "{}"))
        stream = bool(_value(request, "stream", False))
        exclude = bool(_value(request, "exclude_input_in_output", False))
        max_tokens = int(_value(request, "max_tokens", sampling.get("max_tokens") or 1 << 30))
        delay = float((re.search(r"<delay=([0-9.]+)>", prompt) or [0, 0])[1])
        if "<params>" in prompt:
            seen = {"sampling": sampling, "stream": stream, "exclude": exclude, "max_tokens_input":
                    _value(request, "max_tokens", None), "prompt": prompt}
            words = [json.dumps(seen)]
        else:
            words = re.findall(r"\S+\s*", prompt)[:max_tokens]
        if not exclude:
            words.insert(0, prompt)
        counts = len(prompt.split()) * 10 if _value(request, "return_num_output_tokens", False) else None
        await self._send(sender, words, stream, delay, "<fail>" in prompt, counts)

    async def _send(self, sender, words, stream, delay, fail, counts):
        sent = []
        for word in words:
            await asyncio.sleep(delay)
            if sender.is_cancelled():
                print(f"openai_echo: cancelled after {len(sent)} words", flush=True)
                sender.send(flags=FINAL)
                return
            if fail and sent:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("failed on request")), flags=FINAL)
                return
            sent.append(word)
            if stream:
                sender.send(_response([word], counts))
        if fail:
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("failed on request")), flags=FINAL)
        elif not stream:
            sender.send(_response(sent, counts), flags=FINAL)
        else:
            sender.send(flags=FINAL)
