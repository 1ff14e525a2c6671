"""The models the server knows of, by name (model control writes it, serving reads it)."""

from __future__ import annotations

from pystub_backend.backend.models.lifecycle import ModelEntry
from pystub_backend.backend.models.version import ModelVersion

__all__ = ["ModelTable"]


class ModelTable:
    """Model name -> ModelEntry. Model control writes it; serving only reads it."""

    def __init__(self) -> None:
        self.entries: dict[str, ModelEntry] = {}

    def versions(self) -> list[ModelVersion]:
        """Every loaded model version, by name then version."""
        return [v for _, entry in sorted(self.entries.items()) for _, v in sorted(entry.versions.items())]

    def loaded(self, name: str) -> bool:
        """Whether some version of the model serves."""
        entry = self.entries.get(name)
        return entry is not None and any(v.loaded for v in entry.versions.values())
