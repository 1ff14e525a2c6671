"""Who reads the stub's channel: the main thread while it waits for work, the receiver thread
while the main thread is busy (running `execute`, `initialize`, `finalize`...).

Why: a synchronous `execute` used to reach the main thread through the receiver thread, a thread
hand-off (a futex wake and a GIL hand-over, ~11 us on 2 cores) on every request. Now the main
thread, when it has nothing to do, reads the next frame itself and runs it; the receiver thread
only reads while the main thread is busy, so that what must be seen during a handler still is:
BLS responses, RELEASE (arena frees, send credits), CANCEL, readiness, metric and model-control
replies.

Ownership (one reader at a time; `owner` changes only under the lock):

    MAIN      the main thread reads when it is idle. When it starts a handler it stays the owner
              but reads nothing; the receiver takes over once the same handler is still running
              at two of its polls (POLL apart), or at once when some thread is about to wait for
              a reply frame (`need_reader`: a BLS request, a metric query, a send credit...).
    HANDLER   the main thread reads inside a handler while it waits for one reply (a BLS call
              from `execute`): frames for others are acted on as the receiver would, main-thread
              frames are queued for later, in order; once the reply is in, reading is MAIN's again
              (and the receiver's at once when another thread asked for a reader meanwhile).
    RECEIVER  the receiver reads, queues main-thread frames on the work queue in arrival order, and
              hands reading back when it sees the main thread waiting idle on that queue: it sets
              `owner` to MAIN *after* its last queued frame, then queues a wake-up (HANDBACK). The
              main thread drains the queue before it reads the socket again, so no frame is lost
              or overtaken.

The receiver's polls cost a wake-up every POLL while requests flow; after IDLE_PARK without any
handler it parks until the main thread starts one (one wake per burst, not per request).
Every wait here has a deadline: the loops re-check the state at least every PARK_CHECK seconds.
"""

from __future__ import annotations

import queue
import threading
import time

__all__ = ["ReadOwnership", "POLL", "HANDBACK"]

POLL = 0.01  # s between the receiver's checks while handlers run (100 wake-ups a second at most)
IDLE_PARK = 0.1  # s without a handler after which the receiver parks until one starts
PARK_CHECK = 1.0  # s: the longest any wait here lasts before the state is checked again

_MAIN = "main"
_RECEIVER = "receiver"
_HANDLER = "handler"  # the main thread reads inside its handler, for the reply it waits for


class _Handback:
    """The wake-up the receiver queues after handing reading back (the main thread skips it)."""

    def __repr__(self) -> str:
        return "HANDBACK"


HANDBACK = _Handback()


class ReadOwnership:
    """The state shared by the main and receiver threads; see the module docstring."""

    def __init__(self, poll: float = POLL, idle_park: float = IDLE_PARK, park_check: float = PARK_CHECK) -> None:
        self._poll = poll
        self._idle_park = idle_park
        self._park_check = park_check
        self._lock = threading.Lock()
        # The receiver's doorbell (the state may have changed): a C-level queue, because the
        # receiver waits on it up to 100 times a second and an Event's Python-level wait costs more.
        self._bell: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._owner = _MAIN
        self._busy = False  # the main thread runs a handler (and reads nothing)
        self._turn = 0  # handlers the main thread has started: tells a long one from the next one
        self._waiting = False  # the main thread waits on the work queue for the receiver's frames
        self._wanted = False  # some thread is about to wait for a reply frame
        self._parked = False  # the receiver waits for the next handler (no polling)
        self._handler_thread = 0  # the thread id reading as _HANDLER

    # -- the main thread ---------------------------------------------------------------------------
    def main_may_read(self) -> bool:
        """True when the main thread owns reading; else it is marked as waiting on the work queue."""
        with self._lock:
            if self._owner == _MAIN:
                return True
            self._waiting = True
            return False

    def handler_started(self) -> None:
        """The main thread starts a handler: from now on it reads nothing until `handler_finished`."""
        with self._lock:
            self._busy, self._waiting = True, False
            self._turn += 1
            wake, self._parked = self._parked or self._wanted, False
        if wake:  # the first handler after a quiet spell, or a reply is still awaited
            self._bell.put(None)

    def handler_finished(self) -> None:
        with self._lock:
            self._busy = False

    def read_in_handler(self) -> bool:
        """The main thread, inside a handler, is about to wait for one reply (a BLS call): True
        when it may read the channel itself until it is in (then `stop_reading_in_handler`), which
        spares the two thread hand-overs of the receiver reading it. False when the receiver
        reads already or another thread waits for a frame."""
        with self._lock:
            if self._owner != _MAIN or not self._busy or self._wanted:
                return False
            self._owner, self._handler_thread = _HANDLER, threading.get_ident()
            return True

    def stop_reading_in_handler(self) -> None:
        """The reply is in (or its wait ended): reading is main's again; a frame another thread
        started waiting for meanwhile is the receiver's to read at once."""
        with self._lock:
            self._owner, self._handler_thread = _MAIN, 0
            wake = self._wanted and self._busy
        if wake:
            self._bell.put(None)

    # -- any thread ----------------------------------------------------------------------------------
    def need_reader(self) -> None:
        """A thread is about to wait for a frame: if nobody reads now, the receiver takes over at
        once; if the main thread reads now, the receiver takes over as soon as it starts a handler
        (the reply may come after that, while the handler runs), or, while the handler reads for
        its own reply, as soon as that is in."""
        with self._lock:
            if self._owner == _HANDLER:
                if threading.get_ident() != self._handler_thread:
                    self._wanted = True  # stop_reading_in_handler rings
                return
            if self._owner != _MAIN:
                return  # the receiver reads
            self._wanted = True
            if not self._busy:
                return  # the main thread reads; handler_started rings
        self._bell.put(None)

    # -- the receiver thread -------------------------------------------------------------------------
    def wait_for_turn(self) -> None:
        """Block until the receiver owns reading: the main thread is busy and either a reply is
        awaited or the same handler has run across two polls."""
        seen = -1
        last_busy = time.monotonic()
        while True:
            with self._lock:
                if self._owner == _MAIN and self._busy and (self._wanted or self._turn == seen):
                    self._owner, self._wanted = _RECEIVER, False
                    return
                now = time.monotonic()
                if self._busy:
                    last_busy = now
                seen = self._turn if self._busy else -1
                self._parked = not self._busy and now - last_busy > self._idle_park
                timeout = self._park_check if self._parked else self._poll
            self._wait_for_bell(timeout)

    def _wait_for_bell(self, timeout: float) -> None:
        """Wait up to `timeout` s for a ring; rings that piled up count as one (the state is read
        again under the lock afterwards, so none is lost)."""
        try:
            self._bell.get(timeout=timeout)
        except queue.Empty:
            return
        while not self._bell.empty():
            self._bell.get_nowait()

    def give_back(self) -> bool:
        """After each frame or empty poll: True when the main thread waits idle on the work queue,
        and reading is now its again (the caller then queues HANDBACK)."""
        with self._lock:
            if self._waiting and not self._busy:
                self._owner, self._waiting = _MAIN, False
                return True
            return False
