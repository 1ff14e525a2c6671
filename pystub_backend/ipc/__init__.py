"""Shared by backend and stub: arenas, channels, the message catalogue, the control block, names.

No model or server logic lives here.
"""

from pystub_backend.ipc.arena import EMPTY_HANDLE, ArenaFullError, ArenaReader, ArenaWriter, Handle
from pystub_backend.ipc.channel import AsyncChannel, BlockingChannel, ChannelClosedError, ChannelTimeoutError, make_pair
from pystub_backend.ipc.control_block import ControlBlock, StubState
from pystub_backend.ipc.status import Status

__all__ = [
    "ArenaFullError", "ArenaReader", "ArenaWriter", "AsyncChannel", "BlockingChannel",
    "ChannelClosedError", "ChannelTimeoutError", "ControlBlock", "EMPTY_HANDLE", "Handle",
    "Status", "StubState", "make_pair",
]
