"""Every message a stub may send to the backend, as one union: what the backend's frame dispatcher
(backend/supervision/frames.py) and the feature handlers it calls receive.

    ToBackend       the union of the classes the catalogue lists as TO_BACKEND or BOTH
    TO_BACKEND      the same classes as a tuple, for the check at run time
    is_to_backend   that check: narrows a decoded frame (of any registered kind) to ToBackend

A dispatcher narrows the union by class (`isinstance(message, Response)`), so each branch sees
the fields of its kind. A unit test checks the union against the catalogue, kind for kind.
"""

from __future__ import annotations

from typing import TypeGuard, Union, get_args

from pystub_backend.ipc.messages.bls import (
    BlsCancel,
    BlsCleanup,
    BlsInspect,
    BlsRequest,
    DeviceCleanup,
    ModelControl,
)
from pystub_backend.ipc.messages.client_shm import ClientShmForgotten
from pystub_backend.ipc.messages.core import (
    AutoCompleteDone,
    ExecuteDone,
    FinalizeDone,
    InitDone,
    IsReadyDone,
    Log,
    Release,
    Response,
    Spilled,
)
from pystub_backend.ipc.messages.forks import ForkCheckDone, ForkDone, ForkedExit
from pystub_backend.ipc.messages.metrics import MetricFamilyCreate, MetricOps, MetricValueQuery
from pystub_backend.ipc.messages.multiplex import (
    MultiplexLoaded,
    MultiplexLoadFailed,
    MultiplexUnloaded,
    MultiplexUsage,
)
from pystub_backend.ipc.messages.sequences import SequenceRescheduled

__all__ = ["ToBackend", "TO_BACKEND", "is_to_backend"]

ToBackend = Union[
    # core: the request exchange, the stub's log, big frames, the replies to the backend's calls
    Response, ExecuteDone, Release, Log, Spilled, AutoCompleteDone, InitDone, FinalizeDone, IsReadyDone,
    # features
    BlsRequest, BlsCancel, BlsCleanup, BlsInspect, ModelControl, DeviceCleanup,
    MetricFamilyCreate, MetricOps, MetricValueQuery,
    SequenceRescheduled,
    MultiplexLoaded, MultiplexLoadFailed, MultiplexUnloaded, MultiplexUsage,
    ClientShmForgotten,
    ForkCheckDone, ForkDone, ForkedExit,
]

TO_BACKEND: tuple[type[ToBackend], ...] = get_args(ToBackend)
_KINDS = frozenset(TO_BACKEND)  # decoded messages are of their registered class exactly


def is_to_backend(message: object) -> TypeGuard[ToBackend]:
    """Whether a decoded message is of a kind the stub may send (not one only the backend sends)."""
    return type(message) in _KINDS
