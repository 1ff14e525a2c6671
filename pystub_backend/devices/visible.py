"""CUDA_VISIBLE_DEVICES as CUDA reads it: which physical GPUs are visible, in which order.

Entries are comma-separated indices or UUID prefixes, of a GPU ("GPU-8a1f...") or of a MIG device
("MIG-5c3e..."); CUDA stops at the first entry that is invalid, unknown or repeated, so "0,-1,1"
means just device 0 and "" or "-1" means none. Unset: every device, in NVML's order (pystub
assumes CUDA_DEVICE_ORDER=PCI_BUS_ID, NVML's order, as Triton's documentation advises).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["visible_physical", "pinned_entry"]

_VARIABLE = "CUDA_VISIBLE_DEVICES"


def visible_physical(uuids: Sequence[str], environ: Mapping[str, str]) -> list[int]:
    """The indices of the visible devices, in logical order, given the UUID of each device CUDA can
    enumerate (NVML's order: GPUs, MIG devices in place of a GPU in MIG mode)."""
    text = environ.get(_VARIABLE)
    if text is None:
        return list(range(len(uuids)))
    chosen: list[int] = []
    for entry in (part.strip() for part in text.split(",")):
        index = _entry_index(entry, uuids)
        if index is None or index in chosen:
            break
        chosen.append(index)
    return chosen


def _entry_index(entry: str, uuids: Sequence[str]) -> int | None:
    if entry.isdigit():
        index = int(entry)
        return index if index < len(uuids) else None
    if not entry.startswith(("GPU-", "MIG-")):
        return None
    matches = [i for i, uuid in enumerate(uuids) if uuid.startswith(entry)]
    return matches[0] if len(matches) == 1 else None


def pinned_entry(environ: Mapping[str, str], logical: int) -> str:
    """The CUDA_VISIBLE_DEVICES value under which logical device `logical` (as `environ` numbers
    it) is the only device: its own entry, read the way CUDA reads the list."""
    text = environ.get(_VARIABLE)
    if text is None:
        return str(logical)
    entries = [part.strip() for part in text.split(",")]
    if not 0 <= logical < len(entries):
        raise ValueError(f"{_VARIABLE}={text!r} has no device {logical}")
    return entries[logical]
