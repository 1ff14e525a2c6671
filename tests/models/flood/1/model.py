"""Streams COUNT responses of BYTES bytes (COUNT 0: until cancelled) from a thread per request,
`pause_ms` (a request parameter) apart, and records in `record_dir` (a request parameter) when the
request started and how it ended: cancelled (the model saw is_cancelled()), refused (send raised:
the client's window stayed full), or done."""

import json
import os
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _parameter(request, name, default):
    return json.loads(request.parameters() or "{}").get(name, default)


def _note(request, what):
    directory = _parameter(request, "record_dir", "")
    if directory:
        with open(os.path.join(directory, f"{request.request_id()}.{what}"), "w"):
            pass


def _stream(request):
    sender = request.get_response_sender()
    count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
    size = int(pb_utils.get_input_tensor_by_name(request, "BYTES").as_numpy()[0])
    payload = np.full(size, 7, np.uint8)
    pause = float(_parameter(request, "pause_ms", 0)) / 1000
    _note(request, "started")
    sent = 0
    while count == 0 or sent < count:
        if sender.is_cancelled():
            _note(request, "cancelled")
            sender.send(flags=FINAL)
            return
        try:
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", payload)]))
        except pb_utils.TritonModelException:
            _note(request, "cancelled" if sender.is_cancelled() else "refused")
            return
        sent += 1
        if pause:
            time.sleep(pause)
    _note(request, "done")
    sender.send(flags=FINAL)


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            threading.Thread(target=_stream, args=(request,), daemon=True).start()
        return None
