"""Poll mode: the repository is read every `--repository-poll-secs` and the server follows it.

    every poll ──▶ new directory ─────────▶ start a load        (not awaited: a load whose
                   changed directory ─────▶ start a reload       initialize hangs must not hold
                   removed directory ─────▶ start an unload      up the next poll)
                   changed again while its load still runs ──▶ cancel that load, start the newer

A load is started at most once per state of the directory (its fingerprint): one that failed is
not retried until the directory changes again. A load still starting when the directory changes
is superseded: it is cancelled (its stubs are killed) and the new state loads, so a fixed
`model.py` replaces one whose `initialize` hangs without waiting for the init timeout.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from pystub_backend.backend.core.table import ModelTable
from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.models.repository import RepositoryError, find_models, model_fingerprint

__all__ = ["RepositoryPoller", "Fingerprint"]

log = logging.getLogger("pystub.core")
Fingerprint = frozenset[tuple[str, int, int]]


class _Control(Protocol):
    """What the poller asks of model control."""

    def start_load(self, name: str, path: str, fingerprint: Fingerprint) -> asyncio.Task[Any]: ...

    def start_unload(self, name: str) -> asyncio.Task[Any]: ...

    def cancel_loads(self, name: str) -> None: ...


class RepositoryPoller:
    """Compares the repositories with what is loaded and starts the operations that follow."""

    def __init__(self, repositories: list[str], table: ModelTable, control: _Control) -> None:
        self._repositories = repositories
        self._table = table
        self._control = control
        self._pending: dict[str, Fingerprint] = {}  # loads started and not ended: what they load

    async def poll_forever(self, seconds: float) -> None:
        while True:
            await asyncio.sleep(seconds)
            try:
                await self.poll()
            except Exception:  # a bad poll must not end polling
                log.exception("repository poll failed")

    async def poll(self) -> None:
        """Start loading new model directories, reloading changed ones and unloading removed ones;
        returns without waiting for them."""
        try:
            found = find_models(self._repositories)
        except RepositoryError as exc:
            log.error("repository poll: %s", exc)
            return
        fingerprints = await asyncio.to_thread(lambda: {n: model_fingerprint(p) for n, p in found.items()})
        for name, path in found.items():
            self._follow(name, path, fingerprints[name])
        for name, entry in list(self._table.entries.items()):
            if name not in found and (entry.fingerprint is not None or name in self._pending):
                log.info("repository poll: '%s' was removed; unloading it", name)
                self._control.cancel_loads(name)
                self._watch(self._control.start_unload(name))

    def _follow(self, name: str, path: str, wanted: Fingerprint) -> None:
        entry = self._table.entries.get(name)
        current = self._pending.get(name, entry.fingerprint if entry is not None else None)
        if current == wanted:
            return
        if name in self._pending:
            log.info("repository poll: '%s' changed again while loading; cancelling that load", name)
            self._control.cancel_loads(name)
        log.info("repository poll: %s '%s'", "reloading" if entry and entry.versions else "loading", name)
        self._pending[name] = wanted
        task = self._control.start_load(name, path, wanted)
        task.add_done_callback(lambda _: self._ended(name, wanted))
        self._watch(task)

    def _ended(self, name: str, fingerprint: Fingerprint) -> None:
        if self._pending.get(name) == fingerprint:
            del self._pending[name]

    @staticmethod
    def _watch(task: asyncio.Task[Any]) -> None:
        task.add_done_callback(_log_unexpected)


def _log_unexpected(task: asyncio.Task[Any]) -> None:
    """A load or unload the poll started ended; its ServerError was logged where it arose."""
    if task.cancelled():
        return
    error = task.exception()
    if error is not None and not isinstance(error, ServerError):
        log.error("repository poll: an operation failed", exc_info=error)

