"""Every message kind between the backend and a stub, and between a frontend worker and the core,
in one table: number, name, direction, feature. The classes live in the feature modules next to
this one (core, bls, metrics, sequences, multiplex, client_shm, workers, forks); a unit test checks that
this table and the registry of `pystub_backend.ipc.wire` agree, kind for kind, and that no number
is used twice.

Kinds are allocated by range, one range per feature:

    1-19   core            20-29  bls (and model control)     30-39  metrics
    40-49  sequences       50-59  multiplex                   60-69  client_shm
    70-79  workers (the frontend workers' core link, not a stub channel)
    80-89  forks (the shared-weights template: its channel and its fork socket)
"""

from __future__ import annotations

import enum
from typing import NamedTuple

__all__ = ["Direction", "Entry", "CATALOGUE", "entry_of"]


class Direction(enum.Enum):
    TO_STUB = "backend -> stub"
    TO_BACKEND = "stub -> backend"
    BOTH = "both ways"
    TO_CORE = "frontend worker -> core"
    TO_WORKER = "core -> frontend worker"


class Entry(NamedTuple):
    kind: int
    name: str
    direction: Direction
    feature: str


_S, _B, _2 = Direction.TO_STUB, Direction.TO_BACKEND, Direction.BOTH
_C, _W = Direction.TO_CORE, Direction.TO_WORKER

CATALOGUE: tuple[Entry, ...] = (
    Entry(1, "AutoComplete", _S, "core"),
    Entry(2, "AutoCompleteDone", _B, "core"),
    Entry(3, "Init", _S, "core"),
    Entry(4, "InitDone", _B, "core"),
    Entry(5, "Execute", _S, "core"),
    Entry(6, "ExecuteDone", _B, "core"),
    Entry(7, "Response", _B, "core"),
    Entry(8, "Release", _2, "core"),  # each side frees the other's arena handles, returns credits
    Entry(9, "Log", _B, "core"),
    Entry(10, "Finalize", _S, "core"),
    Entry(11, "FinalizeDone", _B, "core"),
    Entry(12, "IsReady", _S, "core"),
    Entry(13, "IsReadyDone", _B, "core"),
    Entry(14, "Cancel", _S, "core"),
    Entry(15, "Spilled", _2, "core"),  # a frame over the frame limit, in the sender's arena
    Entry(20, "BlsRequest", _B, "bls"),
    Entry(21, "BlsResponse", _S, "bls"),
    Entry(22, "BlsCancel", _B, "bls"),
    Entry(23, "BlsCleanup", _B, "bls"),
    Entry(24, "ModelControl", _B, "model_control"),
    Entry(25, "ModelControlDone", _S, "model_control"),
    Entry(26, "BlsInspect", _B, "bls"),
    Entry(27, "BlsInspectDone", _S, "bls"),
    Entry(28, "DeviceCleanup", _B, "bls"),  # GPU outputs by CUDA IPC: mappings a caller closed
    Entry(29, "DeviceRelease", _S, "bls"),  # ... and exports nobody maps any more
    Entry(30, "MetricFamilyCreate", _B, "metrics"),
    Entry(31, "MetricOps", _B, "metrics"),
    Entry(32, "MetricValueQuery", _B, "metrics"),
    Entry(33, "MetricReply", _S, "metrics"),
    Entry(40, "SequenceEvicted", _S, "sequences"),
    Entry(41, "SequenceRescheduled", _B, "sequences"),
    Entry(42, "SequenceDropRescheduled", _S, "sequences"),
    Entry(50, "MultiplexConfigure", _S, "multiplex"),
    Entry(51, "MultiplexLoaded", _B, "multiplex"),
    Entry(52, "MultiplexLoadFailed", _B, "multiplex"),
    Entry(53, "MultiplexUnloaded", _B, "multiplex"),
    Entry(54, "MultiplexUsage", _B, "multiplex"),
    Entry(60, "ClientShmForget", _S, "client_shm"),
    Entry(61, "ClientShmForgotten", _B, "client_shm"),  # ... its mappings are closed
    Entry(70, "WorkerHello", _C, "workers"),
    Entry(71, "WorkerInfer", _C, "workers"),
    Entry(72, "WorkerCancel", _C, "workers"),
    Entry(73, "WorkerAnswer", _W, "workers"),
    Entry(74, "WorkerError", _W, "workers"),
    Entry(80, "ForkCheck", _S, "forks"),  # to a template: can it fork now?
    Entry(81, "ForkCheckDone", _B, "forks"),
    Entry(82, "Fork", _S, "forks"),  # on the fork socket, with the child's descriptors
    Entry(83, "ForkDone", _B, "forks"),  # ... with the child's pidfd
    Entry(84, "ForkedExit", _B, "forks"),  # a forked instance reaped by its template
)

_BY_KIND = {entry.kind: entry for entry in CATALOGUE}


def entry_of(kind: int) -> Entry:
    """The catalogue entry of a kind number. Raises KeyError for a kind that is not in it."""
    return _BY_KIND[kind]
