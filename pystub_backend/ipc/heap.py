"""Keeping freed tensor-sized blocks in the process heap (glibc malloc's thresholds).

Every request that crosses a process copies its tensors through buffers of their size: the HTTP
body, the gRPC message, the encoded response. glibc serves a block above its mmap threshold
(128 KiB at start) with a fresh mmap and unmaps it on free, and gives the heap's free top back to
the kernel once it passes the trim threshold. Either way the next request's buffer lands on pages
the kernel must fault in and zero again: at 1 MiB that was 180 (HTTP) to 565 (gRPC) page faults per
request in the backend, about 40 % of its CPU per request. glibc raises both thresholds by itself
after it frees a mapped block, but the heap top is still trimmed under load.

`raise_malloc_thresholds` fixes them where glibc's own adjustment would end (an mmap threshold of
32 MiB, its largest, and a trim threshold twice that): blocks up to 32 MiB are reused from the heap,
and up to 64 MiB of free heap top stays mapped per malloc arena. Larger tensors still get their
own mapping and give it back, and the HTTP and gRPC frontends trim the heap after a connection
that carried much closes (backend/frontends/heap_trim.py). An operator's own settings (`MALLOC_MMAP_THRESHOLD_`,
`MALLOC_TRIM_THRESHOLD_`, `GLIBC_TUNABLES=glibc.malloc.*`) win: then nothing is changed.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "raise_malloc_thresholds"]

MMAP_THRESHOLD = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD  # the ratio glibc's dynamic adjustment keeps

_M_TRIM_THRESHOLD = -1  # mallopt parameters, <malloc.h>
_M_MMAP_THRESHOLD = -3
_OPERATOR_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")


def _operator_tuned(environ: Mapping[str, str]) -> bool:
    return any(name in environ for name in _OPERATOR_VARIABLES) or "glibc.malloc." in environ.get("GLIBC_TUNABLES", "")


def raise_malloc_thresholds(environ: Mapping[str, str] = os.environ) -> bool:
    """Set glibc malloc's mmap and trim thresholds (see the module docstring) unless the operator
    tuned malloc through the environment. Whether they were set; never raises (a C library without
    mallopt, or musl's, which accepts none: False)."""
    if _operator_tuned(environ):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # no C library to ask, or one without mallopt
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
