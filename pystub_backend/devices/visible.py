"""CUDA_VISIBLE_DEVICES as CUDA reads it: which physical GPUs are visible, in which order.

Entries are comma-separated physical indices or UUID prefixes ("GPU-8a1f..."); CUDA stops at the
first entry that is invalid, unknown or repeated, so "0,-1,1" means just device 0 and "" or "-1"
means none. Unset: every device, in NVML's order (pystub assumes CUDA_DEVICE_ORDER=PCI_BUS_ID,
NVML's order, as Triton's documentation advises).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["visible_physical"]

_VARIABLE = "CUDA_VISIBLE_DEVICES"


def visible_physical(uuids: Sequence[str], environ: Mapping[str, str]) -> list[int]:
    """The physical indices of the visible devices, in logical order, given each physical
    device's UUID (NVML's order)."""
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
    if not entry.startswith("GPU-"):
        return None
    matches = [i for i, uuid in enumerate(uuids) if uuid.startswith(entry)]
    return matches[0] if len(matches) == 1 else None
