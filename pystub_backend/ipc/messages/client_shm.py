"""Messages of the client shared memory feature (kinds 60-69).

    backend -> stub
    ---------------
    ClientShmForget (generations)   these registrations are gone and no request uses them any
                                    more: drop their mappings, refuse later references to them

Tensors in client regions travel as region handles inside the core messages (pystub_backend.ipc.tensors).
"""

from __future__ import annotations

from typing import NamedTuple

from pystub_backend.ipc.wire import message

__all__ = ["ClientShmForget"]


@message(60)
class ClientShmForget(NamedTuple):
    generations: list[int]
