"""The models the server knows of, by name (model control writes it, serving reads it), and what a
model name may hold.

A name the repository does not hold must not leave state behind: the table
forgets an entry that a failed load created for such a name (`forget_if_unheld`), and
`check_model_name` refuses, with INVALID_ARG, names no model directory can have: empty, `.`/`..`,
holding `/`, control characters (they would split log lines), Unicode line/paragraph separators,
lone surrogates, or longer than a directory name may be (NAME_MAX, 255 bytes). Serving calls it
only when a lookup misses, so requests for loaded models pay nothing for it.
"""

from __future__ import annotations

import unicodedata

from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.models.lifecycle import ModelEntry
from pystub_backend.backend.models.state import ModelState
from pystub_backend.backend.models.version import ModelVersion
from pystub_backend.ipc.status import Status

__all__ = ["ModelTable", "check_model_name", "shown_name", "NAME_MAX"]

NAME_MAX = 255  # bytes of one path component on Linux: a model directory's name cannot be longer
_SHOWN = 64  # characters of a refused name that an error text repeats
_BAD_CATEGORIES = frozenset({"Cc", "Cs", "Zl", "Zp"})  # controls, surrogates, line/paragraph separators


def shown_name(name: str) -> str:
    """`name` as an error text or log line may show it: control characters escaped, long names cut."""
    escaped = "".join(c if unicodedata.category(c) not in _BAD_CATEGORIES else ascii(c)[1:-1]
                      for c in name[:_SHOWN])
    return escaped if len(name) <= _SHOWN else f"{escaped}...({len(name)} characters)"


def _flaw(name: str) -> str:
    if not name or name in (".", ".."):
        return "a model name cannot be empty, '.' or '..'"
    if "/" in name:
        return "a model name cannot hold '/'"
    if any(unicodedata.category(c) in _BAD_CATEGORIES for c in name):
        return "a model name cannot hold control characters or line separators"
    if len(name.encode("utf-8", "surrogatepass")) > NAME_MAX:
        return f"a model name is at most {NAME_MAX} bytes (it names a directory)"
    return ""


def check_model_name(name: str) -> None:
    """Raise ServerError (INVALID_ARG) when no model directory could have this name."""
    flaw = _flaw(name)
    if flaw:
        raise ServerError(f"invalid model name '{shown_name(name)}': {flaw}", Status.INVALID_ARG)


class ModelTable:
    """Model name -> ModelEntry. Model control writes it; serving only reads it."""

    def __init__(self) -> None:
        self.entries: dict[str, ModelEntry] = {}

    def versions(self) -> list[ModelVersion]:
        """Every loaded model version, by name then version."""
        return [v for name in sorted(self.entries) for v in self.versions_of(name)]

    def versions_of(self, name: str) -> list[ModelVersion]:
        """The loaded versions of one model, by version (none for a name it does not hold)."""
        entry = self.entries.get(name)
        if entry is None:
            return []
        versions = entry.versions
        return list(versions.values()) if len(versions) == 1 else [v for _, v in sorted(versions.items())]

    def loaded(self, name: str) -> bool:
        """Whether some version of the model serves."""
        entry = self.entries.get(name)
        return entry is not None and any(v.loaded for v in entry.versions.values())

    def forget_if_unheld(self, entry: ModelEntry, held: bool) -> bool:
        """Drop `entry` when nothing of it serves or drains and the repository does not hold its
        name (`held`): a failed load of such a name leaves no row, lock or text behind."""
        if held or entry.versions or entry.retiring or entry.override is not None:
            return False
        if self.entries.get(entry.name) is entry:
            del self.entries[entry.name]
        return True

    def index_rows(self, found: dict[str, str], ready_only: bool = False) -> list[dict[str, str]]:
        """Every model the server knows of, and every model directory `found` in the repositories
        that was never loaded (as in Triton's explicit mode, such a row has only a name)."""
        rows = [row for entry in self.entries.values() for row in entry.index_rows()]
        rows.extend({"name": name} for name in found if name not in self.entries)
        rows.sort(key=lambda row: (row["name"], int(row.get("version") or 0)))
        # Triton omits an empty reason (a loaded model's row is {name, version, state}).
        return [{key: value for key, value in row.items() if key != "reason" or value}
                for row in rows if not ready_only or row.get("state") == ModelState.READY.value]
