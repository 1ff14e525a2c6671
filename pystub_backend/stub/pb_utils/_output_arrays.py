"""`new_output_array`: an output array in shared memory from the start (pystub extension).

Returned in an `InferenceResponse` (as `Tensor(name, array)`), it reaches the client without the
copy into the arena that an ordinary numpy array costs. Outside a stub it is a plain `np.empty`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pystub_backend.stub.pb_utils import _runtime

__all__ = ["new_output_array"]


def new_output_array(shape: Any, dtype: Any = np.float32) -> np.ndarray:
    """An uninitialised, writable array for an output, allocated in the stub's arena.

    Fill it, then return it in a response; it is handed over once (a second response carrying the
    same array gets a copy). Raises TypeError for object dtypes (BYTES), and the arena's
    `Failed to increase the shared memory pool size ...` error when shared memory is exhausted.
    """
    allocate = _runtime.output_allocator()
    if allocate is None:
        return np.empty(shape, dtype)
    return allocate(shape, dtype)
