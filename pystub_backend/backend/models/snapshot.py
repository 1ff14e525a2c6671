"""The Python files a model version was loaded with, kept for the version's whole life.

A supervised restart of one of the version's stubs must run the code of the version that serves,
not whatever the repository holds by then: in poll mode a new `model.py` that fails to load
leaves the old version serving, and a restart that imported the new file would take the old
version down with it. So at load the version reads its `model.py` and the other `.py` files under
its version directory, and every stub it starts (the first and each restart) imports those bytes
under their real paths (stub.loader); other files (weights, data) are read from the repository.

The snapshot travels in the INIT frame, so it is bounded: `model.py` first, then the other files in
path order while they fit in `budget` bytes; a file past the budget is imported from disk.
"""

from __future__ import annotations

import logging
import os

__all__ = ["snapshot_sources"]

log = logging.getLogger("pystub.model")


def _python_files(version_dir: str) -> list[str]:
    found: list[str] = []
    for root, dirs, files in os.walk(version_dir):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
        found.extend(os.path.join(root, name) for name in sorted(files) if name.endswith(".py"))
    return found


def snapshot_sources(model_path: str, budget: int) -> dict[str, bytes]:
    """Absolute path -> bytes of `model_path` and the `.py` files beside it (recursively), at most
    `budget` bytes in all. Unreadable files are left out (the import then reports them)."""
    model_path = os.path.abspath(model_path)
    paths = [model_path] + [p for p in _python_files(os.path.dirname(model_path)) if p != model_path]
    sources: dict[str, bytes] = {}
    left = budget
    for path in paths:
        try:
            with open(path, "rb") as file:
                data = file.read(left + 1)
        except OSError:
            continue
        if len(data) > left:
            log.warning("model file '%s' is not kept for restarts (the files kept exceed %d bytes); a restart "
                        "imports it from the repository", path, budget)
            continue
        sources[path] = data
        left -= len(data)
    return sources
