"""Device ids inside a stub: the server's logical ids, and the CUDA ordinals its model sees.

pystub's own records (tensors, BLS handles, client regions) carry the server's logical ids. The
model's process numbers devices as CUDA does in it: the same ids by default (the stub keeps the
server's CUDA_VISIBLE_DEVICES, as Triton's stubs do), or, for an instance pinned to its GPU
(`PYSTUB_PIN_GPU: "yes"`), that one GPU alone as ordinal 0 (`pin`). What crosses between the two
is translated where the model hands pystub an id or gets one: DLPack devices, PreferredMemory,
`model_instance_device_id`, and the CUDA calls of cuda_runtime.

    PYSTUB_PINNED_GPU=<server id>   set in a pinned stub's environment, with CUDA_VISIBLE_DEVICES
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping

from pystub_backend.devices.interface import DeviceError
from pystub_backend.devices.visible import pinned_entry

__all__ = ["DeviceNumbering", "PINNED_VARIABLE", "device_numbering", "pin"]

PINNED_VARIABLE = "PYSTUB_PINNED_GPU"


class DeviceNumbering:
    """Server logical ids <-> the process's CUDA ordinals (the identity unless pinned)."""

    def __init__(self, pinned: int | None = None) -> None:
        self.pinned = pinned

    def to_local(self, server_id: int) -> int:
        """The CUDA ordinal of server device `server_id` here. Raises DeviceError when a pinned stub
        cannot see it."""
        if self.pinned is None:
            return server_id
        if server_id != self.pinned:
            raise DeviceError(f"GPU {server_id} is not visible in this stub: it sees only GPU {self.pinned} "
                              f"(PYSTUB_PIN_GPU)")
        return 0

    def to_server(self, local_id: int) -> int:
        """The server id of CUDA ordinal `local_id` here. Raises DeviceError for an ordinal a
        pinned stub does not have."""
        if self.pinned is None:
            return local_id
        if local_id != 0:
            raise DeviceError(f"this stub sees one GPU (cuda:0, the server's GPU {self.pinned}); "
                              f"cuda:{local_id} does not exist here (PYSTUB_PIN_GPU)")
        return self.pinned

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> DeviceNumbering:
        value = environ.get(PINNED_VARIABLE)
        return cls(int(value) if value else None)


_numbering: DeviceNumbering | None = None


def device_numbering() -> DeviceNumbering:
    """This process's numbering, read from its environment on first use (after `pin`, if any)."""
    global _numbering
    if _numbering is None:
        _numbering = DeviceNumbering.from_environ(os.environ)
    return _numbering


def pin(environ: MutableMapping[str, str], device_id: int) -> None:
    """Make server GPU `device_id` the only device this process's CUDA sees (before CUDA starts).
    Raises ValueError when CUDA_VISIBLE_DEVICES has no such device."""
    global _numbering
    environ["CUDA_VISIBLE_DEVICES"] = pinned_entry(environ, device_id)
    environ[PINNED_VARIABLE] = str(device_id)
    _numbering = DeviceNumbering(device_id)
