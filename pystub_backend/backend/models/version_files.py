"""The files a model version runs from, as a reload compares them: a version whose files changed since
it loaded is reloaded whole, even when its config changed only in its instances.

As Triton 2.51 counts them (model_repository_manager.cc, `ModelTimestamp::IsModelVersionModified`):
the version's own directory, and whatever else the model directory holds (shared modules, data)
but its config file and the other versions' directories. Unlike Triton, the `__pycache__` that
importing the model writes does not count (`repository.model_fingerprint`): Triton's first update
after a load is a full reload because its stub wrote one.
"""

from __future__ import annotations

import os

from pystub_backend.backend.models.repository import config_file, model_fingerprint

__all__ = ["VersionFiles", "version_files"]

VersionFiles = frozenset[tuple[str, int, int]]  # (relative path, mtime_ns, size), as model_fingerprint


def version_files(model_dir: str, versions: list[int], config_name: str = "") -> dict[int, VersionFiles]:
    """Each version's files (see the module docstring), from one walk of the model directory."""
    config_entry = os.path.relpath(config_file(model_dir, config_name), model_dir).split(os.sep)[0]
    shared: set[tuple[str, int, int]] = set()
    own: dict[str, set[tuple[str, int, int]]] = {}
    for entry in model_fingerprint(model_dir):
        top = os.path.normpath(entry[0]).split(os.sep)[0]
        if top == config_entry:
            continue
        if top.isdigit():
            own.setdefault(top, set()).add(entry)
        else:
            shared.add(entry)
    return {version: frozenset(shared | own.get(str(version), set())) for version in versions}
