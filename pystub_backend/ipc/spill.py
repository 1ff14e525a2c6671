"""Frames larger than the channel's frame limit: the frame travels in the sender's arena.

A control frame is capped at `channel.MAX_FRAME` (the socket's datagram size), but request
metadata has no such cap in the protocol: a 140 KB request id, 20,000 requested outputs, large
parameters or many inputs are all valid. Rather than refusing them, the sender writes the encoded
frame into its own arena, like a tensor, and sends a small SPILLED frame naming it:

    sender                                        receiver
    frame = encode(message)   (> MAX_FRAME)
    handle = arena.write(frame)
    SPILLED [handle] ───────────────────────────▶ view(handle) → decode → dispatch the message
                     ◀─────────────────────────── RELEASE [handle]   (the sender frees it)

Backend → stub frames spill into p2s, stub → backend frames into s2p; each side frees only its
own arena, on the other's RELEASE, as for tensors. A spilled frame that names another SPILLED
frame is corrupt. Frames within the limit are sent as before: one length test on the hot path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from pystub_backend.ipc.channel import MAX_FRAME
from pystub_backend.ipc.messages.core import Spilled
from pystub_backend.ipc.wire import MessageDecodeError, decode, encode

__all__ = ["Spilled", "fits", "spill", "unspill"]


class _Writer(Protocol):
    def write(self, data: Any) -> tuple[int, int, int]: ...


class _Viewer(Protocol):
    def view(self, handle: Any) -> memoryview: ...


def fits(frame: bytes) -> bool:
    return len(frame) <= MAX_FRAME


def spill(frame: bytes, arena: _Writer) -> tuple[bytes, list[int]]:
    """(the SPILLED frame for `frame`, the handle of its bytes, written into `arena`). Raises
    ArenaFullError when the arena cannot hold them (nothing is kept)."""
    handle = list(arena.write(frame))
    return encode(Spilled(handle)), handle


def unspill(message: Spilled, arena: _Viewer, release: Callable[[list[int]], None]) -> NamedTuple:
    """The message the SPILLED frame names, decoded from the sender's arena; `release(handle)` is
    called once the bytes are copied out (whether they decode or not), so the sender can free them.

    Raises MessageDecodeError for a corrupt one: a handle that is not three ints (not released: it
    names nothing), bytes that cannot be read or decoded, or a spilled frame inside."""
    handle = message.handle
    if len(handle) != 3 or not all(type(part) is int for part in handle):
        raise MessageDecodeError(f"a spilled frame's handle must be three ints, not {handle!r}")
    try:
        view = arena.view(handle)
    except Exception as exc:  # noqa: BLE001 - any failure to map a corrupt handle is a corrupt frame
        release(handle)
        raise MessageDecodeError(f"spilled frame at {handle} cannot be read: {exc}") from exc
    try:
        inner = decode(view)
    finally:
        view.release()
        release(handle)
    if isinstance(inner, Spilled):
        raise MessageDecodeError("a spilled frame names another spilled frame")
    return inner
