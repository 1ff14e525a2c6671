"""The states a model (and each of its versions) goes through, as the repository index shows them.

    UNAVAILABLE ──load──▶ LOADING ──ok──▶ READY ──unload / replaced──▶ UNLOADING ──▶ UNAVAILABLE
                              └──failed──▶ UNAVAILABLE (the reason says why)

The values are Triton's strings (the index rows carry them as they are).
"""

from __future__ import annotations

import enum

__all__ = ["ModelState", "UNLOADED_REASON"]

UNLOADED_REASON = "unloaded"  # the reason of a model (version) unloaded on purpose


class ModelState(str, enum.Enum):
    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"

    def __str__(self) -> str:
        return self.value
