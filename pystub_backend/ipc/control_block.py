"""The control block: a small anonymous shm segment per stub that the supervisor reads.

The stub writes it (heartbeat from a thread that never runs model code, state, execute start);
the backend creates it (a sealed memfd, segment.py), hands its descriptor to the stub process at
spawn (`take_fd`, inherited by the child), reads it, and closes it. It has no name.

    offset size  field
    0      4     magic b"PSCB"
    4      4     layout version (uint32)
    8      4     stub pid (uint32)
    12     4     state (uint32, `StubState`)
    16     8     heartbeat: CLOCK_MONOTONIC seconds (float64; system-wide on Linux)
    24     8     start of the execute in progress, CLOCK_MONOTONIC seconds, 0 when idle (float64)
    32     8     executions completed (uint64)
    40     8     s2p arena bytes in use (uint64), written with the heartbeat
    48     8     s2p arena bytes reserved (uint64)
"""

from __future__ import annotations

import enum
import struct
import time

from pystub_backend.ipc.segment import Segment

__all__ = ["ControlBlock", "StubState", "CONTROL_BLOCK_SIZE"]

_LAYOUT = struct.Struct("<4sIIIddQQQ")
_MAGIC = b"PSCB"
_VERSION = 2
CONTROL_BLOCK_SIZE = 4096
_PID = struct.Struct("<I")
_STATE = struct.Struct("<I")
_F64 = struct.Struct("<d")
_U64 = struct.Struct("<Q")


class StubState(enum.IntEnum):
    STARTING = 0
    READY = 1
    FINALIZING = 2
    EXITED = 3


class ControlBlock:
    def __init__(self, segment: Segment) -> None:
        self.segment = segment
        self._view = segment.view

    @classmethod
    def create(cls, label: str) -> ControlBlock:
        """A fresh block. Raises SegmentCreateError."""
        block = cls(Segment.create(label, CONTROL_BLOCK_SIZE))
        _LAYOUT.pack_into(block._view, 0, _MAGIC, _VERSION, 0, StubState.STARTING, 0.0, 0.0, 0, 0, 0)
        return block

    def take_fd(self) -> int:
        """The block's (writable) descriptor, for the stub process; the caller closes it."""
        return self.segment.take_fd(writable=True)

    @classmethod
    def attach_fd(cls, fd: int) -> ControlBlock:
        """Map the block behind `fd` for writing (the caller closes `fd`). Raises
        SegmentCreateError, and ValueError when it is not a control block."""
        block = cls(Segment.from_fd(fd, writable=True, label="control block"))
        magic, version = struct.unpack_from("<4sI", block._view, 0)
        if magic != _MAGIC or version != _VERSION:
            block.close()
            raise ValueError(f"descriptor {fd} is not a version {_VERSION} control block")
        return block

    # -- stub side -----------------------------------------------------------------------------
    def set_pid(self, pid: int) -> None:
        _PID.pack_into(self._view, 8, pid)

    def set_state(self, state: StubState) -> None:
        _STATE.pack_into(self._view, 12, int(state))

    def beat(self) -> None:
        _F64.pack_into(self._view, 16, time.monotonic())

    def set_arena(self, used: int, total: int) -> None:
        _U64.pack_into(self._view, 40, used)
        _U64.pack_into(self._view, 48, total)

    def execute_started(self) -> None:
        _F64.pack_into(self._view, 24, time.monotonic())

    def execute_finished(self) -> None:
        _F64.pack_into(self._view, 24, 0.0)
        _U64.pack_into(self._view, 32, self.executions + 1)

    # -- readers -------------------------------------------------------------------------------
    @property
    def pid(self) -> int:
        return _PID.unpack_from(self._view, 8)[0]

    @property
    def state(self) -> StubState:
        return StubState(_STATE.unpack_from(self._view, 12)[0])

    @property
    def heartbeat(self) -> float:
        return _F64.unpack_from(self._view, 16)[0]

    @property
    def execute_start(self) -> float:
        return _F64.unpack_from(self._view, 24)[0]

    @property
    def executions(self) -> int:
        return _U64.unpack_from(self._view, 32)[0]

    @property
    def s2p_used(self) -> int:
        return _U64.unpack_from(self._view, 40)[0]

    @property
    def s2p_total(self) -> int:
        return _U64.unpack_from(self._view, 48)[0]

    def heartbeat_age(self) -> float | None:
        """Seconds since the last heartbeat, or None before the first one."""
        beat = self.heartbeat
        return None if beat == 0.0 else max(0.0, time.monotonic() - beat)

    def close(self) -> None:
        self._view = memoryview(b"")
        self.segment.close()
