"""The stub's side of custom metrics: mirrors `pb_utils.MetricFamily` / `Metric` to the backend,
whose registry serves them on `/metrics` (frames in `pystub_backend.ipc.messages.metrics`).

    model code ──▶ pb_utils (validation, local state) ──▶ MetricsReporter
        family_created   MetricFamilyCreate, waits for the reply: a name another model registered
                         with another kind fails here, as it does in Triton
        metric_created   buffered, then flushed with a MetricValueQuery behind it, waits: the
                         series is on `/metrics` once the model has its Metric, as in Triton
        metric_operation ┐ buffered: one entry per series, changes aggregated in order
        metric_deleted   ┘
        metric_value     flush, MetricValueQuery, waits: `value()` is the server's value

Why buffer: a frame per `increment` would cost the model a send (and the backend a wake-up) per
call; aggregated, a hot loop of increments costs a dict lookup and an addition each. The buffer is
flushed as MetricOps frames
- before any other frame the stub sends (`before_send`), so a response never reaches the backend
  ahead of the metric changes made before it: once a client has its answer, `/metrics` shows them;
- inline when it grows past MAX_ENTRIES series or MAX_OBSERVATIONS histogram observations;
- by a flusher thread FLUSH_DELAY seconds after the first buffered change (threads the model runs
  outside `execute`).
Flushes are serialized (the flush lock is held while sending), so frames leave in buffer order.
"""

from __future__ import annotations

import itertools
import re
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from pystub_backend.ipc.channel import ChannelClosedError, ChannelTimeoutError, FrameTooLargeError
from pystub_backend.ipc.messages.metrics import (
    ENTRY_CREATE,
    ENTRY_DELETE,
    ENTRY_UPDATE,
    MetricCreate,
    MetricDelete,
    MetricFamilyCreate,
    MetricOps,
    MetricReply,
    MetricUpdate,
    MetricValueQuery,
)
from pystub_backend.stub.handlers import StubHandlers
from pystub_backend.stub.pb_utils import _runtime

__all__ = ["MetricsReporter", "MetricsError", "check_label_names", "FLUSH_DELAY", "MAX_ENTRIES", "MAX_OBSERVATIONS",
           "register"]

FLUSH_DELAY = 0.05
MAX_ENTRIES = 256
MAX_OBSERVATIONS = 4096
_RECORD_OF: dict[int, type[MetricCreate] | type[MetricUpdate] | type[MetricDelete]] = {
    ENTRY_CREATE: MetricCreate, ENTRY_UPDATE: MetricUpdate, ENTRY_DELETE: MetricDelete}
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

_reporter: MetricsReporter | None = None  # one stub per process: this process's reporter
_flusher: threading.Thread | None = None  # its flusher thread
_FLUSHER_STOP_SECONDS = 5.0  # the flusher notices `close` within a second


class MetricsError(Exception):
    """The server refused a metric call, or did not answer in time; the text is the reason."""


class _Waiter:
    __slots__ = ("event", "reply")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.reply: MetricReply | None = None


def _series_key(family: str, labels: dict[str, str]) -> tuple[str, tuple[tuple[str, str], ...]]:
    return family, tuple(sorted(labels.items()))


def check_label_names(labels: dict[str, str], histogram: bool) -> None:
    """Raises MetricsError for a label name Prometheus would reject."""
    for name in labels:
        if not _LABEL_NAME.match(name) or name.startswith("__"):
            raise MetricsError(f"Invalid label name '{name}'.")
        if histogram and name == "le":
            raise MetricsError("Label name 'le' is reserved for histogram buckets.")


class MetricsReporter:
    """pb_utils' MetricReporter (see `_runtime.MetricReporter`), speaking to the backend through
    `send(message)`; `timeout` bounds every wait for a reply."""

    def __init__(self, send: Callable[[Any], None], timeout: float) -> None:
        self._send = send
        self._timeout = timeout
        # Re-entrant: a Metric dropped by the garbage collector reports its deletion from
        # whatever code runs at that moment, possibly this reporter's own locked region.
        self._buffer_lock = threading.RLock()
        self._flush_lock = threading.RLock()
        self._entries: list[list[Any]] = []
        self._open: dict[Any, list[Any]] = {}  # series -> its UPDATE entry that still takes changes
        self._observations = 0
        self._dirty = threading.Event()
        self._tokens = itertools.count(1)
        self._waiting: dict[int, _Waiter] = {}
        self._closed = False

    # -- pb_utils' reporter methods (model threads) ---------------------------------------------
    def family_created(self, name: str, description: str, kind: int) -> None:
        self._request(lambda token: MetricFamilyCreate(token, name, description, int(kind)),
                      f"the creation of metric family '{name}'")

    def metric_created(self, family: str, labels: dict[str, str], buckets: list[float] | None) -> None:
        """Create the series on the server and wait until it is there: in Triton a metric is on
        `/metrics` (at 0) as soon as it is made, before its first change."""
        check_label_names(labels, buckets is not None)
        self._append(_series_key(family, labels), [ENTRY_CREATE, family, labels, buckets])
        # The query leaves after the flushed CREATE (one channel, in order): its answer means the
        # server has applied it. The value itself is not needed.
        self.metric_value(family, labels)

    def metric_deleted(self, family: str, labels: dict[str, str]) -> None:
        self._append(_series_key(family, labels), [ENTRY_DELETE, family, labels])

    def metric_operation(self, family: str, labels: dict[str, str], op: str, value: float) -> None:
        key = _series_key(family, labels)
        with self._buffer_lock:
            entry = self._open.get(key)
            if entry is None:
                entry = [ENTRY_UPDATE, family, labels, None, 0.0, []]
                self._open[key] = entry
                self._entries.append(entry)
            if op == "increment":
                entry[4] += value
            elif op == "set":  # what came before is overwritten
                entry[3], entry[4] = value, 0.0
            else:
                entry[5].append(value)
                self._observations += 1
            full = len(self._entries) >= MAX_ENTRIES or self._observations >= MAX_OBSERVATIONS
        if full:
            self.flush()
        elif not self._dirty.is_set():  # setting an Event takes a lock: only the first change does
            self._dirty.set()

    def metric_value(self, family: str, labels: dict[str, str]) -> float:
        reply = self._request(lambda token: MetricValueQuery(token, family, labels),
                              f"the value of a metric of family '{family}'")
        return float(reply.value)

    # -- buffer ----------------------------------------------------------------------------------
    @property
    def pending(self) -> bool:
        return bool(self._entries)

    def _append(self, key: Any, entry: list[Any]) -> None:
        with self._buffer_lock:
            self._open.pop(key, None)  # changes after this entry must be applied after it
            self._entries.append(entry)
        self._dirty.set()

    def flush(self) -> None:
        """Send what is buffered, in order. Never raises: when the channel is gone the changes
        are dropped (the backend keeps what it had, see pystub_backend.backend.features.custom_metrics)."""
        with self._flush_lock:
            with self._buffer_lock:
                entries, self._entries = self._entries, []
                self._open.clear()
                self._observations = 0
                self._dirty.clear()
            if entries and not self._closed:
                self._send_entries(entries)

    def _send_entries(self, entries: list[list[Any]]) -> None:
        for start in range(0, len(entries), MAX_ENTRIES):
            chunk = entries[start:start + MAX_ENTRIES]
            try:
                # Buffered as lists (an UPDATE takes changes in place until it is sent).
                self._send(MetricOps([_RECORD_OF[entry[0]](*entry) for entry in chunk]))
            except FrameTooLargeError:
                if len(chunk) == 1:
                    sys.stderr.write(f"pystub: dropped a change of metric family '{chunk[0][1]}': its "
                                     f"labels do not fit in one frame\n")
                else:
                    half = len(chunk) // 2
                    self._send_entries(chunk[:half])
                    self._send_entries(chunk[half:])
            except (ChannelClosedError, ChannelTimeoutError, OSError) as exc:
                self._closed = True
                sys.stderr.write(f"pystub: metric changes not delivered: {exc}\n")
                return

    def run_flusher(self) -> None:
        """The flusher thread's loop: flush FLUSH_DELAY after the first buffered change."""
        while not self._closed:
            if self._dirty.wait(1.0):
                time.sleep(FLUSH_DELAY)  # gather what follows the first change into one frame
                self.flush()

    def close(self) -> None:
        self._closed = True
        self._dirty.set()

    # -- requests that wait for the backend ------------------------------------------------------
    def _request(self, make: Callable[[int], Any], what: str) -> MetricReply:
        token = next(self._tokens)
        waiter = _Waiter()
        self._waiting[token] = waiter
        try:
            try:
                self._send(make(token))  # the before-send hook flushes the buffer first
            except (ChannelClosedError, ChannelTimeoutError, OSError) as exc:
                raise MetricsError(f"the server is not reachable: {exc}") from None
            if not waiter.event.wait(self._timeout):
                raise MetricsError(f"timed out after {self._timeout:g} s waiting for the server to answer {what}")
        finally:
            self._waiting.pop(token, None)
        reply = waiter.reply
        assert reply is not None
        if reply.error is not None:
            raise MetricsError(reply.error)
        return reply

    def on_reply(self, reply: MetricReply) -> None:
        waiter = self._waiting.get(reply.token)
        if waiter is not None:
            waiter.reply = reply
            waiter.event.set()


# -- wiring into the stub ---------------------------------------------------------------------------
def _install(stub: Any) -> None:
    """Connect pb_utils metrics to the backend before the model is imported (module-level
    metric families are common)."""
    global _reporter, _flusher
    reporter = MetricsReporter(stub.send, stub.options.send_timeout)
    _flusher = threading.Thread(target=reporter.run_flusher, name="pystub-metrics-flusher", daemon=True)
    _flusher.start()
    _reporter = reporter
    _runtime.set_metric_reporter(reporter)


def _stop_flusher(stub: Any) -> None:
    """A shared-weights template is about to fork: send what is buffered and end the flusher
    thread (a fork keeps only the forking thread). Each forked instance installs its own."""
    if _reporter is not None:
        _reporter.flush()
        _reporter.close()
    if _flusher is not None:
        _flusher.join(_FLUSHER_STOP_SECONDS)


def _flush_before(stub: Any, message: Any) -> None:
    reporter = _reporter
    if reporter is not None and reporter.pending and type(message) is not MetricOps:
        reporter.flush()


def _on_reply(stub: Any, message: MetricReply) -> None:
    if _reporter is not None:
        _reporter.on_reply(message)


def register(handlers: StubHandlers) -> None:
    """Wire custom metrics into a stub: the reporter, its flush before other frames, its replies."""
    handlers.awaits_reply(MetricFamilyCreate)
    handlers.awaits_reply(MetricValueQuery)
    handlers.on_phase("initializing", _install)
    handlers.on_phase("forking", _stop_flusher)
    handlers.before_send(_flush_before)
    handlers.on_receiver(MetricReply, _on_reply)
