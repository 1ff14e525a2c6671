"""A stand-in LLM: replace `_generate` with a real model's token loop.

Each request is answered from a thread of its own (a decoupled model may answer later, in any
order), one response per word when `stream` is true, else one response with the whole text. It
stops early when the client goes away (`is_cancelled()`), and honours `max_tokens`.
"""

import json
import re
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


def _input(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else tensor.as_numpy().reshape(-1)[0]


def _generate(prompt, max_tokens):
    """The model: its prompt back, word by word."""
    return re.findall(r"\S+\s*", prompt)[:max_tokens]


def _text(text):
    return pb_utils.InferenceResponse([pb_utils.Tensor("text_output", np.array([text.encode()], dtype=object))])


def _answer(request):
    sender = request.get_response_sender()
    prompt = _input(request, "text_input", b"").decode()
    sampling = json.loads(_input(request, "sampling_parameters", b"{}"))
    stream = bool(_input(request, "stream", False))
    words = []
    for word in _generate(prompt, sampling.get("max_tokens") or 4096):
        if sender.is_cancelled():
            break
        words.append(word)
        if stream:
            sender.send(_text(word))
    if not stream:
        sender.send(_text("".join(words)))
    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            threading.Thread(target=_answer, args=(request,), daemon=True).start()
        return None
