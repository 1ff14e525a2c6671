"""Holds the GIL in one C call: busy (SECONDS > 0) or asleep (SECONDS < 0); see config.pbtxt."""

import ctypes
import math
import re
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

_BACKTRACKS = re.compile(r"(a+)+$")  # on "a" * n + "b": about 2**n steps, and `re` never releases the GIL


def _backtrack(n: int) -> float:
    # CPU time, not wall time: on a loaded machine wall time would overstate a step's cost and the
    # call sized from it would hold the GIL for less than asked
    started = time.thread_time()
    _BACKTRACKS.match("a" * n + "b")
    return time.thread_time() - started


def _work(seconds: float) -> None:
    """One regular expression call of at least about `seconds` of CPU (each extra character doubles
    it), so at least as long in wall time, however loaded the machine is."""
    n = 14
    while (took := _backtrack(n)) < 0.2:
        n += 1
    _backtrack(n + max(0, math.ceil(math.log2(seconds / took))))


class TritonPythonModel:
    def initialize(self, args):
        self._gap = 0.0
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self):
        last = time.monotonic()
        while True:
            time.sleep(0.01)
            now = time.monotonic()
            self._gap, last = max(self._gap, now - last), now

    def execute(self, requests):
        responses = []
        for request in requests:
            seconds = float(pb_utils.get_input_tensor_by_name(request, "SECONDS").as_numpy()[0])
            self._gap = 0.0
            if seconds > 0:
                _work(seconds)
            else:
                ctypes.PyDLL(None).sleep(int(-seconds))  # PyDLL: the GIL stays held through the call
            time.sleep(0.1)  # the watcher runs again and records the gap
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("GAP", np.array([self._gap], np.float32))]))
        return responses
