"""Messages of the client shared memory feature (kinds 60-69).

    backend -> stub
    ---------------
    ClientShmForget (generations)      these registrations are gone and no request uses them any
                                       more: drop their mappings, refuse later references to them

    stub -> backend
    ---------------
    ClientShmForgotten (generations)   done: the mappings are closed (an unregister of a CUDA
                                       region answers only then, as Triton's closes its handle)

Tensors in client regions travel as region handles inside the core messages (pystub_backend.ipc.tensors).
"""

from __future__ import annotations

from typing import NamedTuple

from pystub_backend.ipc.wire import message

__all__ = ["ClientShmForget", "ClientShmForgotten"]


@message(60)
class ClientShmForget(NamedTuple):
    generations: list[int]


@message(61)
class ClientShmForgotten(NamedTuple):
    generations: list[int]
