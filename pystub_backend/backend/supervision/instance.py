"""One model instance, supervised: the one home of death, hangs, restarts and readiness.

    STARTING ──init ok──▶ READY ──death / frozen heartbeat / execute deadline──▶ RESTARTING
        │                   ▲                                                      │
        └─init fails─▶ (load error)   back-off, spawn, initialize again ◀──────────┘
                                      boot failure, or too many failures ──▶ FAILED (stays down)

Read top to bottom, as gunicorn's arbiter:
    death       the stub's channel closes → StubProcess fails its requests in flight at once and
                calls `_on_stub_death` → `fail(None)`
    hangs       `watch_health` polls every instance: a frozen stub (a late heartbeat and no
                other sign of life: supervision.hang_judge) or an `execute` past its
                EXECUTE_TIMEOUT_SECONDS → `fail(reason)`
    restarts    `fail` kills the stub (SIGKILL to its process group) and `_restart` spawns a new
                one after a back-off (RestartPolicy). A boot failure (the model does not import,
                its initialize raises, the stub exits with a boot exit code: ipc.exit_codes) is
                not retried: the instance is FAILED with the reason.
    readiness   `healthy` (READY and the stub alive), `usable` (READY or expected back),
                `wait_ready` for workers, `check_ready` for the model's own `is_ready`

Triton's Python backend never restarts a stub and never notices a hung one; pystub does both.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.inference import InferRequest
from pystub_backend.backend.supervision.errors import StubStartError
from pystub_backend.backend.supervision.exchange import Submission
from pystub_backend.backend.supervision.hang_judge import HangJudge
from pystub_backend.backend.supervision.restart_policy import RestartPolicy
from pystub_backend.backend.supervision.services import StubServices
from pystub_backend.backend.supervision.settings import StubSettings
from pystub_backend.backend.supervision.stub_process import StubProcess
from pystub_backend.backend.telemetry.statistics import BatchTiming
from pystub_backend.ipc.exit_codes import BOOT_FAILURES
from pystub_backend.ipc.status import Status

__all__ = ["InstanceState", "InstanceSpec", "ModelInstance", "StubFactory", "watch_health"]

log = logging.getLogger("pystub.supervisor")


class InstanceState(enum.Enum):
    STARTING = "STARTING"
    READY = "READY"
    RESTARTING = "RESTARTING"
    FAILED = "FAILED"
    STOPPED = "STOPPED"


@dataclass
class InstanceSpec:
    """Everything needed to start (and restart) one instance's stub."""

    model_name: str
    model_path: str
    args: dict[str, str]
    stub_settings: dict[str, object]
    settings: StubSettings
    services: StubServices  # handed to each stub, for its feature frame handlers
    execute_timeout: float | None = None
    rlimits: dict[str, int] = field(default_factory=dict)
    python: list[str] | None = None  # interpreter command (an execution environment's), None = ours
    sources: dict[str, bytes] | None = None  # the model's files at load: every spawn imports these


# Makes one stub incarnation (not yet spawned); tests pass a fake one.
StubFactory = Callable[[str, InstanceSpec], StubProcess]


def _real_stub(name: str, spec: InstanceSpec) -> StubProcess:
    return StubProcess(name, spec.settings, spec.model_name, spec.services)


class ModelInstance:
    def __init__(self, name: str, spec: InstanceSpec, stub_factory: StubFactory = _real_stub) -> None:
        self.name = name
        self.spec = spec
        self.stub: StubProcess | None = None
        self.state = InstanceState.STARTING
        self.restarts = 0
        self.last_error = ""
        self._served_before = 0  # by the stubs before the current one
        self._failed_before = 0
        self._refused = 0  # batches' requests refused because no stub could take them
        self.policy = RestartPolicy(spec.settings)
        self._stub_factory = stub_factory
        self._judge: HangJudge | None = None  # the current stub's hang verdicts
        self._ready = asyncio.Event()
        self._restart_task: asyncio.Task[None] | None = None
        # BLS calls an execute of the current stub waits for (pystub_backend.backend.features.bls.call): see hold().
        self._holds = 0
        self._held_stub: StubProcess | None = None
        # An execute of the current stub waits for a BLS call (hold()): an attribute, read for
        # every request the schedulers place.
        self.held = False
        self._on_change: list[Callable[[], None]] = []  # schedulers that follow readiness

    def on_change(self, callback: Callable[[], None]) -> None:
        """Call `callback()` whenever the instance may take work again or never will: READY after
        a (re)start, a BLS hold released, FAILED or STOPPED."""
        self._on_change.append(callback)

    def _changed(self) -> None:
        self._ready.set()
        for callback in self._on_change:
            callback()

    # -- starting --------------------------------------------------------------------------------
    async def start(self) -> None:
        """First start. Raises StubStartError with the model's error (a load failure)."""
        await self._spawn()

    async def _spawn(self) -> None:
        old = self.stub
        if old is not None and old.exchange is not None:  # what it served still counts
            self._served_before += old.exchange.served
            self._failed_before += old.exchange.failed
        stub = self._stub_factory(self.name, self.spec)
        stub.on_death = self._on_stub_death
        self.stub = stub
        self.held = False  # holds were the old stub's
        self._judge = HangJudge(self.spec.settings.heartbeat_timeout_seconds, stub.progress)
        stub.spawn(self.spec.python, self.spec.rlimits)
        try:
            await stub.initialize(self.spec.model_path, self.spec.args, self.spec.stub_settings, self.spec.sources)
        except StubStartError as exc:
            stub.on_death = None
            await stub.stop(finalize_timeout=0)  # reaps it: its exit code is known below
            if stub.exit_code in BOOT_FAILURES:
                exc.boot_failure = True
            raise
        except asyncio.CancelledError:  # the load was given up (superseded, shutdown): kill, not finalize
            stub.on_death = None
            await stub.stop(finalize_timeout=0)
            self.stub = None
            raise
        self.state = InstanceState.READY
        self._changed()

    # -- death -------------------------------------------------------------------------------------
    def _on_stub_death(self, stub: StubProcess) -> None:
        if stub is self.stub and self.state is InstanceState.READY:
            self.fail(None)  # the reason (exit code or signal) is known once the process is reaped

    # -- hangs -------------------------------------------------------------------------------------
    def check_health(self, now: float, lateness: float = 0.0) -> str | None:
        """Why the current stub must be replaced (frozen: HangJudge; execute deadline), or None.
        `lateness`: how much later than asked this check runs (the supervisor's own starvation)."""
        stub = self.stub
        if not self.healthy or stub is None or self._judge is None:
            return None
        frozen = self._judge.judge(now, stub.heartbeat_age(now), lateness)
        if frozen is not None:
            return frozen
        started = stub.execute_started()
        timeout = self.spec.execute_timeout
        if timeout and started and now - started > timeout:
            return f"execute has run for {now - started:.1f} s (EXECUTE_TIMEOUT_SECONDS={timeout:g})"
        return None

    # -- restarts ----------------------------------------------------------------------------------
    def fail(self, reason: str | None) -> None:
        """The stub is dead (`reason` None) or hung: kill it (which fails what it holds) and restart
        it with back-off."""
        if self.state is not InstanceState.READY:
            return
        if reason is not None:
            self.last_error = reason
            log.error("Stub process '%s' is not healthy: %s", self.name, reason)
        stub = self.stub
        if stub is not None:
            stub.on_death = None
            stub.kill()
        self.state = InstanceState.RESTARTING
        self._restart_task = asyncio.ensure_future(self._restart(stub))

    async def _restart(self, old: StubProcess | None) -> None:
        if old is not None:
            hung = old.alive
            await old.stop(finalize_timeout=0)
            if not hung:
                self.last_error = f"the stub process (pid {old.pid}) {old.death_reason()}"
                log.error("Stub process '%s' is not healthy: %s", self.name, self.last_error)
        self.policy.record_failure(time.monotonic())
        if self.policy.exhausted:
            self._give_up(f"{self.policy.summary()}; last: {self.last_error}")
            return
        while self.state is InstanceState.RESTARTING:
            await asyncio.sleep(self.policy.delay())
            if self.state is not InstanceState.RESTARTING:
                return
            try:
                await self._spawn()
            except (StubStartError, OSError) as exc:
                self.last_error = str(exc)
                self.policy.record_failure(time.monotonic())
                if isinstance(exc, StubStartError) and exc.boot_failure:
                    self._give_up(f"restart failed and would fail again: {exc}")
                    return
                if self.policy.exhausted:
                    self._give_up(f"restart failed: {exc}")
                    return
                continue
            self.restarts += 1
            log.info("Stub process '%s' restarted (restart %d, pid %s)", self.name, self.restarts,
                     self.stub.pid if self.stub else None)
            return

    def _give_up(self, reason: str) -> None:
        self.state = InstanceState.FAILED
        self.last_error = reason
        self._changed()  # wake waiting workers so they see FAILED
        log.error("Stub process '%s' is FAILED and stays down: %s", self.name, reason)

    async def restart(self) -> None:
        """Operator-requested restart (stubctl): finalize the current stub, start a new one."""
        if self.state is InstanceState.READY and self.stub is not None:
            old = self.stub
            old.on_death = None
            self.state = InstanceState.RESTARTING
            await old.stop(self.spec.settings.stub_timeout_seconds)
        elif self.state not in (InstanceState.FAILED, InstanceState.RESTARTING):
            return
        self.state = InstanceState.RESTARTING
        self.policy.reset()
        await self._spawn()
        self.restarts += 1

    async def stop(self, timeout: float) -> None:
        self.state = InstanceState.STOPPED
        self._changed()
        if self._restart_task is not None:
            self._restart_task.cancel()
            await asyncio.gather(self._restart_task, return_exceptions=True)
        if self.stub is not None:
            self.stub.on_death = None
            await self.stub.stop(timeout)

    # -- readiness ---------------------------------------------------------------------------------
    @property
    def healthy(self) -> bool:
        return self.state is InstanceState.READY and self.stub is not None and self.stub.alive

    @property
    def alive(self) -> bool:  # what schedulers and admin rows ask
        return self.healthy

    @property
    def usable(self) -> bool:
        """READY now, or expected back (restarting): a worker should wait for it."""
        return self.state in (InstanceState.READY, InstanceState.RESTARTING, InstanceState.STARTING)

    def unhealthy_error(self) -> ServerError:
        return ServerError(f"Stub process '{self.name}' is not healthy.", Status.UNAVAILABLE)

    async def wait_ready(self) -> bool:
        """Wait until READY and not held by a BLS call; False when the instance will not come back
        (FAILED or STOPPED)."""
        while not self.healthy or self.held:
            if not self.usable:
                return False
            self._ready.clear()
            await self._ready.wait()
        return True

    async def check_ready(self) -> str | None:
        """None when the instance can serve and its model says it is ready (`is_ready`), else why not."""
        stub = self.stub
        if not self.healthy or stub is None:
            return self.unhealthy_error().message
        return await stub.check_ready()

    # -- BLS holds ---------------------------------------------------------------------------------
    def hold(self, stub: StubProcess) -> None:
        """An execute running on `stub` waits for a BLS call: pipeline no new work to this instance
        until the call ends. The stub could only queue that work behind the waiting execute, and
        when the call needs this very model (a cycle) the work would never run while another
        instance might be free (Triton's instances take work only when idle)."""
        if stub is not self._held_stub:
            self._held_stub, self._holds = stub, 0
        self._holds += 1
        self.held = stub is self.stub

    def release_hold(self, stub: StubProcess) -> None:
        if stub is self._held_stub and self._holds:
            self._holds -= 1
            if not self._holds:
                self.held = False
                self._changed()

    # -- work --------------------------------------------------------------------------------------
    gate = None  # no admission step before a batch (the rate limiter's wrapper has one)

    def submit(self, requests: list[InferRequest], *, wait: bool) -> Submission | None:
        """Run a batch on the current stub (supervision.exchange: per request its ResponseStream
        or a ServerError, and a future for the end of `execute`). With `wait=False`, None when it
        cannot be sent now (the caller queues it); with `wait=True` an instance that cannot serve
        answers every request with its error."""
        stub = self.stub
        if self.state is not InstanceState.READY or stub is None or stub.exchange is None or not stub.alive:
            if not wait:
                return None
            self._refused += len(requests)
            return Submission([self.unhealthy_error()] * len(requests), BatchTiming(), None)
        return stub.exchange.submit(requests, wait=wait)

    @property
    def served(self) -> int:
        """Requests its stubs answered (stubctl's SERVED)."""
        exchange = self.stub.exchange if self.stub is not None else None
        return self._served_before + (exchange.served if exchange is not None else 0)

    @property
    def failed(self) -> int:
        """Requests that failed on its stubs, or could not reach them (stubctl's FAILED)."""
        exchange = self.stub.exchange if self.stub is not None else None
        return self._failed_before + self._refused + (exchange.failed if exchange is not None else 0)


async def watch_health(instances: Callable[[], list[ModelInstance]], interval: float) -> None:
    """Replace stubs that froze (no heartbeat) or overran the execute deadline, forever (cancel it).
    Death is seen at once through the channel; this loop catches the hangs."""
    due = time.monotonic() + interval
    while True:
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        now = time.monotonic()
        lateness, due = max(0.0, now - due), now + interval
        for instance in instances():
            reason = instance.check_health(now, lateness)
            if reason is not None:
                instance.fail(reason)
