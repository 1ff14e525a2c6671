"""The backend side of a shared-weights template: one stub per model version that runs the
model's `initialize` once and forks the version's KIND_CPU instances (docs/shared-weights.md).

    WeightsTemplate.ready()   start the template if it is not running (one start, however many
                              instances ask), run INIT, then FORK_CHECK: True when it may fork,
                              False when it refused (threads left running, a GPU context, open
                              sockets: one warning, the template is finalized, and every instance
                              loads the ordinary way from then on). Raises StubStartError with
                              the model's error when initialize fails (the load fails as usual)
    WeightsTemplate.fork()    FORK on the fork socket (supervision.fork_link): a ForkedChild and
                              its pidfd. A fork past its deadline means a hung template: it is
                              killed, so the next ready() starts a new one
    death                     the template's channel closes: its children die with it (their
                              parent-death signal); each instance's supervisor restarts its stub,
                              whose ready() starts a new template (initialize runs again), and
                              re-forks. Children it can no longer report are "orphaned": their
                              exit is their pidfd's, and their status SIGKILL (the signal the
                              kernel sent them)
    stop()                    after the instances stopped: FINALIZE (the model's finalize runs in
                              the template last), the stop ladder, nothing left

`TemplateProcess` is a StubProcess that also inherits the fork socket (`--fork-fd`).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from collections.abc import Callable

from pystub_backend.backend.supervision.errors import StubStartError
from pystub_backend.backend.supervision.fork_link import ForkFailedError, ForkLink
from pystub_backend.backend.supervision.instance import InstanceSpec
from pystub_backend.backend.supervision.stub_process import StubProcess
from pystub_backend.ipc.channel import ChannelClosedError, ChannelTimeoutError, make_pair
from pystub_backend.ipc.messages.forks import ForkCheck, ForkCheckDone

__all__ = ["WeightsTemplate", "TemplateProcess", "ForkedChild"]

log = logging.getLogger("pystub.supervisor")


class TemplateProcess(StubProcess):
    """The template's stub process: spawned as any stub, with its fork socket inherited."""

    fork_socket: socket.socket | None = None

    def spawn(self, python: list[str] | None = None, rlimits: dict[str, int] | None = None) -> None:
        backend_end, template_end = make_pair()
        self.extra_fds = (template_end.fileno(),)
        try:
            super().spawn(python, rlimits)
        except BaseException:
            backend_end.close()
            raise
        finally:
            template_end.close()
            self.extra_fds = ()
        self.fork_socket = backend_end

    def _command(self, python: list[str] | None, fds: tuple[int, int], rlimits: dict[str, int]) -> list[str]:
        return [*super()._command(python, fds, rlimits), "--fork-fd", str(self.extra_fds[0])]


class ForkedChild:
    """A forked instance's process as its StubProcess sees it (exit_watch.WatchedProcess): the
    template reaps it and reports its status."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.orphaned = False  # its template is gone: no status will come
        self.exited: Callable[[], bool] = lambda: False  # its pidfd's verdict (set by its stub)

    def poll(self) -> int | None:
        if self.returncode is None and self.orphaned and self.exited():
            self.returncode = -signal.SIGKILL  # the parent-death signal; nobody is left to say otherwise
        return self.returncode


class WeightsTemplate:
    def __init__(self, name: str, spec: InstanceSpec) -> None:
        """`spec`: how to start the template (the first shared instance's, whose `args` its
        `initialize` receives)."""
        self.name = name
        self.spec = spec
        self.refusal: str | None = None  # why it cannot fork: ordinary mode for good
        self.initializations = 0  # how often the model's initialize ran here
        self._process: TemplateProcess | None = None
        self._link: ForkLink | None = None
        self._starting: asyncio.Future[bool] | None = None
        self._children: dict[int, ForkedChild] = {}
        self._stopped = False

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def _running(self) -> bool:
        process, link = self._process, self._link
        return process is not None and process.alive and link is not None and not link.closed

    # -- starting ------------------------------------------------------------------------------
    async def ready(self) -> bool:
        """Whether instances can be forked now (starting the template first if needed); False:
        load them the ordinary way. Raises StubStartError when the template cannot start."""
        if self.refusal is not None:
            return False
        if self._stopped:
            raise StubStartError(f"the template '{self.name}' is stopped")
        if self._running() and (self._starting is None or self._starting.done()):
            return True
        if self._starting is None or self._starting.done():
            self._starting = asyncio.ensure_future(self._start())
        try:
            return await asyncio.shield(self._starting)
        except StubStartError as exc:  # each instance gets its own copy of the template's error
            raise StubStartError(str(exc), exc.boot_failure) from exc

    async def _start(self) -> bool:
        await self._discard()  # a dead one's leftovers
        spec = self.spec
        process = self._process = TemplateProcess(self.name, spec.settings, spec.model_name, spec.services)
        process.on_death = self._on_death
        try:
            process.spawn(spec.python, spec.rlimits)
            assert process.fork_socket is not None and process.link is not None
            self._link = ForkLink(process.fork_socket, self.name, self._on_child_exit, self._orphan_children)
            await process.initialize(spec.model_path, spec.args, spec.stub_settings, spec.sources)
            self.initializations += 1
            check = await process.link.request_reply(ForkCheck(), ForkCheckDone,
                                                     spec.settings.stub_init_timeout_seconds, "the fork check")
        except BaseException:
            await self._discard()
            raise
        if check.refusal is not None:
            self.refusal = check.refusal
            log.warning("model '%s' does not share its weights: %s. Its instances load the ordinary way, each "
                        "running initialize.", spec.model_name, check.refusal)
            await self._discard(spec.settings.stub_timeout_seconds)
            return False
        log.info("template '%s' (pid %s) initialized model '%s' once; its instances are forked from it",
                 self.name, process.pid, spec.model_name)
        return True

    # -- forking -------------------------------------------------------------------------------
    async def fork(self, instance: str, base: str, fds: list[int]) -> tuple[ForkedChild, int]:
        """Fork `instance` (its channel end, control block, stdout, stderr in `fds`, which the
        caller closes after); returns the child and its pidfd. Raises StubStartError."""
        link = self._link
        if not self._running() or link is None:
            raise StubStartError(f"the template '{self.name}' is not running")
        try:
            pid, pidfd = await link.fork(instance, base, fds, self.spec.settings.stub_init_timeout_seconds)
        except ChannelTimeoutError as exc:
            log.error("template '%s' is not answering (%s): killing it", self.name, exc)
            if self._process is not None:
                self._process.kill()
            raise StubStartError(str(exc)) from exc
        except (ChannelClosedError, ForkFailedError) as exc:
            raise StubStartError(str(exc)) from exc
        child = self._children[pid] = ForkedChild(pid)
        return child, pidfd

    def _on_child_exit(self, pid: int, status: int) -> None:
        child = self._children.pop(pid, None)
        if child is not None:
            child.returncode = status

    def _orphan_children(self) -> None:
        for child in self._children.values():
            child.orphaned = True
        self._children.clear()

    # -- death and stop ------------------------------------------------------------------------
    def _on_death(self, process: StubProcess) -> None:
        if process is self._process and not self._stopped:
            log.error("template '%s' (pid %s) %s: its instances die with it; the next restart starts a new "
                      "template", self.name, process.pid, process.death_reason())
        self._orphan_children()

    async def _discard(self, finalize_timeout: float = 0) -> None:
        process, self._process = self._process, None
        link, self._link = self._link, None
        if process is not None:
            process.on_death = None
            await process.stop(finalize_timeout)
        if link is not None:
            link.close()
        self._orphan_children()

    async def stop(self, timeout: float) -> None:
        """End the template (call after its instances stopped). Never raises."""
        self._stopped = True
        starting = self._starting
        if starting is not None and not starting.done():
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
        await self._discard(timeout)
