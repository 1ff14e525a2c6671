"""pystub_backend.backend.supervision.instance: the supervision policy (death, hangs, restarts, boot
failures, readiness) against a fake stub that dies, hangs or fails to boot on command, as gunicorn
tests its arbiter. The fake stands in for the process only; the policy code is the real one."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from pystub_backend.backend.features.install import feature_services
from pystub_backend.backend.supervision.errors import StubStartError
from pystub_backend.backend.supervision.hang_judge import ProcessProgress
from pystub_backend.backend.supervision.instance import (
    InstanceSpec,
    InstanceState,
    ModelInstance,
    watch_health,
)
from pystub_backend.backend.supervision.restart_policy import RestartPolicy
from pystub_backend.backend.supervision.settings import StubSettings
from pystub_backend.ipc.exit_codes import StubExitCode, describe_exit


class FakeStub:
    """A stub incarnation whose boot is scripted: "ok", "boot" (the model raised: a boot failure),
    "crash" (died during initialize), "exit:<code>" (exited with that code during initialize)."""

    def __init__(self, name: str, boot: str) -> None:
        self.instance_name = name
        self.boot = boot
        self.on_death: Callable[[Any], None] | None = None
        self.alive = False
        self.exit_code: int | None = None
        self.killed = False
        self.stopped = False
        self.started_at = time.monotonic()
        self.frozen_since: float | None = None
        self.execute_since: float | None = None
        self.pid = 4000 + id(self) % 1000
        self.exchange = None  # no requests go through these stubs

    def spawn(self, python: list[str] | None, rlimits: dict[str, int]) -> None:
        self.alive = True

    async def initialize(self, model_path: str, args: dict[str, str], settings: dict[str, object],
                         sources: dict[str, bytes] | None = None) -> None:
        await asyncio.sleep(0)
        if self.boot == "ok":
            return
        self.alive = False
        if self.boot == "boot":
            self.exit_code = int(StubExitCode.INITIALIZE_FAILED)
            raise StubStartError("ValueError: no weights", boot_failure=True)
        self.exit_code = -9 if self.boot == "crash" else int(self.boot.split(":")[1])
        raise StubStartError(f"stub process '{self.instance_name}' died while waiting for initialize")

    # commands of the test
    def die(self, code: int = -11) -> None:
        self.alive, self.exit_code = False, code
        if self.on_death is not None:
            self.on_death(self)

    # what the supervisor asks
    def heartbeat_age(self, now: float) -> float:
        return now - self.frozen_since if self.frozen_since is not None else 0.0

    def execute_started(self) -> float | None:
        return self.execute_since

    def progress(self) -> ProcessProgress | None:
        # asleep, using no CPU: a frozen heartbeat is a hang
        return ProcessProgress({1: ("S", 0.0)}) if self.alive else None

    def death_reason(self) -> str:
        return "was killed by signal SIGKILL" if self.exit_code == -9 else describe_exit(self.exit_code or 0)

    def kill(self) -> None:
        self.killed = True  # as SIGKILL: the process is reaped in stop()
        self.exit_code = -9

    async def stop(self, finalize_timeout: float) -> None:
        self.stopped = True
        self.alive = False

    async def check_ready(self) -> str | None:
        return None


class Factory:
    """Hands out FakeStubs booting as scripted (the last script repeats)."""

    def __init__(self, *boots: str) -> None:
        self.boots = list(boots)
        self.made: list[FakeStub] = []

    def __call__(self, name: str, spec: InstanceSpec) -> Any:
        boot = self.boots.pop(0) if len(self.boots) > 1 else self.boots[0]
        self.made.append(FakeStub(name, boot))
        return self.made[-1]


def _instance(factory: Factory, max_restarts: int = 5, execute_timeout: float | None = None) -> ModelInstance:
    settings = StubSettings(max_restarts=max_restarts, restart_backoff_seconds=0.001,
                            restart_backoff_max_seconds=0.01, heartbeat_timeout_seconds=1.0)
    spec = InstanceSpec("m", "/nowhere/model.py", {}, {}, settings, feature_services(None),
                        execute_timeout=execute_timeout)
    return ModelInstance("m_0", spec, stub_factory=factory)


async def _until(condition: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.001)


def _run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(test())


def test_a_stub_that_dies_is_replaced_and_readiness_follows() -> None:
    async def main() -> None:
        factory = Factory("ok")
        instance = _instance(factory)
        await instance.start()
        assert instance.state is InstanceState.READY and instance.healthy
        assert await instance.check_ready() is None
        factory.made[0].die(-11)
        assert instance.state is InstanceState.RESTARTING and not instance.healthy
        assert instance.usable, "a restarting instance is expected back: workers wait for it"
        assert await instance.check_ready() == "Stub process 'm_0' is not healthy."
        assert await asyncio.wait_for(instance.wait_ready(), 5.0) is True
        assert instance.stub is factory.made[1] and instance.restarts == 1
        assert factory.made[0].stopped, "the dead incarnation is stopped (its shm released)"
        assert "exited with code" in instance.last_error or "signal" in instance.last_error
        await instance.stop(1.0)
        assert await instance.wait_ready() is False

    _run(main)


def test_a_frozen_heartbeat_is_detected_and_the_stub_killed_and_restarted() -> None:
    async def main() -> None:
        factory = Factory("ok")
        instance = _instance(factory)
        await instance.start()
        watch = asyncio.ensure_future(watch_health(lambda: [instance], 0.01))
        try:
            assert instance.check_health(time.monotonic()) is None
            hung = factory.made[0]
            hung.frozen_since = time.monotonic() - 2.0  # the limit is 1 s
            await _until(lambda: instance.restarts == 1 and instance.healthy, "the restart after the hang")
            assert hung.killed, "a hung stub is killed, which fails what it holds"
            assert instance.last_error.startswith("no heartbeat for ") and "asleep, using no CPU" in instance.last_error
        finally:
            watch.cancel()
            await instance.stop(1.0)

    _run(main)


def test_an_execute_past_its_deadline_is_a_hang() -> None:
    async def main() -> None:
        instance = _instance(Factory("ok"), execute_timeout=0.5)
        await instance.start()
        assert instance.stub is not None
        now = time.monotonic()
        instance.stub.execute_since = now - 0.2  # type: ignore[attr-defined]
        assert instance.check_health(now) is None
        instance.stub.execute_since = now - 3.0  # type: ignore[attr-defined]
        reason = instance.check_health(now)
        assert reason is not None and "EXECUTE_TIMEOUT_SECONDS=0.5" in reason
        await instance.stop(1.0)

    _run(main)


def test_a_boot_failure_is_not_retried() -> None:
    async def main() -> None:
        factory = Factory("ok", "boot", "ok")
        instance = _instance(factory)
        await instance.start()
        factory.made[0].die(-9)
        waiter = asyncio.ensure_future(instance.wait_ready())
        await _until(lambda: instance.state is InstanceState.FAILED, "FAILED")
        assert len(factory.made) == 2, "one respawn attempt, no loop"
        assert "no weights" in instance.last_error and "would fail again" in instance.last_error
        assert await asyncio.wait_for(waiter, 5.0) is False, "waiting workers learn it will not come back"
        assert not instance.usable
        await instance.stop(1.0)

    _run(main)


@pytest.mark.parametrize("code", [StubExitCode.MODEL_IMPORT_FAILED, StubExitCode.INITIALIZE_FAILED,
                                  StubExitCode.BAD_ARGUMENTS, StubExitCode.BOOT_FAILED])
def test_a_boot_exit_code_during_a_restart_is_a_boot_failure(code: StubExitCode) -> None:
    async def main() -> None:
        factory = Factory("ok", f"exit:{int(code)}", "ok")
        instance = _instance(factory)
        await instance.start()
        factory.made[0].die(-9)
        await _until(lambda: instance.state is InstanceState.FAILED, "FAILED")
        assert len(factory.made) == 2
        await instance.stop(1.0)

    _run(main)


def test_crashes_during_restart_are_retried_until_the_policy_gives_up() -> None:
    async def main() -> None:
        factory = Factory("ok", "crash")  # every respawn dies during initialize (a signal: maybe transient)
        instance = _instance(factory, max_restarts=3)
        await instance.start()
        factory.made[0].die(-9)
        await _until(lambda: instance.state is InstanceState.FAILED, "FAILED")
        # the death, then respawns until more than 3 failures are in the window
        assert len(factory.made) == 1 + 3
        assert "restart failed" in instance.last_error
        await instance.stop(1.0)

    _run(main)


def test_a_model_exit_code_after_ready_is_a_death_not_a_boot_failure() -> None:
    async def main() -> None:
        factory = Factory("ok")
        instance = _instance(factory)
        await instance.start()
        factory.made[0].die(int(StubExitCode.INITIALIZE_FAILED))  # the model called os._exit(72) while serving
        assert await asyncio.wait_for(instance.wait_ready(), 5.0) is True
        assert instance.restarts == 1
        await instance.stop(1.0)

    _run(main)


def test_the_first_start_failing_raises_the_model_error() -> None:
    async def main() -> None:
        factory = Factory("boot")
        instance = _instance(factory)
        with pytest.raises(StubStartError, match="no weights") as raised:
            await instance.start()
        assert raised.value.boot_failure
        assert factory.made[0].stopped
        await instance.stop(1.0)

    _run(main)


def test_restart_policy_backs_off_and_gives_up_within_its_window() -> None:
    settings = StubSettings(max_restarts=2, restart_window_seconds=10.0, restart_backoff_seconds=0.1,
                            restart_backoff_max_seconds=0.3)
    policy = RestartPolicy(settings)
    assert policy.delay() == pytest.approx(0.1)
    policy.record_failure(100.0)
    assert policy.delay() == pytest.approx(0.1) and not policy.exhausted
    policy.record_failure(101.0)
    assert policy.delay() == pytest.approx(0.2) and not policy.exhausted
    policy.record_failure(102.0)
    assert policy.delay() == pytest.approx(0.3), "capped"
    assert policy.exhausted
    policy.record_failure(115.0)  # the three earlier failures left the window
    assert not policy.exhausted and policy.delay() == pytest.approx(0.1)
