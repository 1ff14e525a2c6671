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


def unspill(message: Spilled, arena: _Viewer) -> NamedTuple:
    """The message the SPILLED frame names, decoded from the sender's arena (the bytes are copied
    out: the caller may release the handle at once). Raises MessageDecodeError for a corrupt one."""
    try:
        view = arena.view(message.handle)
    except (ValueError, IndexError, KeyError, OSError) as exc:
        raise MessageDecodeError(f"spilled frame at {message.handle} cannot be read: {exc}") from exc
    try:
        inner = decode(view)
    finally:
        view.release()
    if isinstance(inner, Spilled):
        raise MessageDecodeError("a spilled frame names another spilled frame")
    return inner
