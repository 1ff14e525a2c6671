"""Faults on demand. MODE: 0 ok (echo), 1 segfault, 2 os._exit(3), 3 hang in execute (heartbeat
keeps beating), 4 SIGSTOP itself (heartbeat stops), 5 allocate past the memory limit,
6 print three lines, 7 sleep 300 ms then echo."""

import ctypes
import os
import signal
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
            if mode == 1:
                ctypes.string_at(0)
            elif mode == 2:
                os._exit(3)
            elif mode == 3:
                time.sleep(3600)
            elif mode == 4:
                os.kill(os.getpid(), signal.SIGSTOP)
            elif mode == 5:
                np.ones(4 * 1024 ** 3, dtype=np.uint8)
            elif mode == 6:
                print("faulty: line one\nfaulty: line two", flush=True)
                print("faulty: line three", flush=True)
            elif mode == 7:
                time.sleep(0.3)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.array([mode], np.int32))]))
        return responses

    def finalize(self):
        raise RuntimeError("finalize failed on purpose")
