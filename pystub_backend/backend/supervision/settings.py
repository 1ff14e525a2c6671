"""Settings for stub processes: `--backend-config=python,<key>=<value>`
(docs/reference/model-api.md#backend-settings)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from pystub_backend.ipc.names import DEFAULT_PREFIX, validate_prefix

__all__ = ["StubSettings", "BackendConfigError", "parse_backend_config", "positive_number"]

MIB = 1 << 20
_Number = TypeVar("_Number", int, float)


class BackendConfigError(ValueError):
    """An invalid `--backend-config` setting; the message is Triton's text where it has one."""


@dataclass
class StubSettings:
    shm_prefix: str = DEFAULT_PREFIX
    shm_default_byte_size: int = 1 * MIB
    shm_growth_byte_size: int = 1 * MIB
    message_queue_size: int = 1000
    thread_pool_size: int = 32
    stub_timeout_seconds: float = 30.0  # bounds every cross-process wait that is not model code
    stub_init_timeout_seconds: float = 600.0  # initialize() may load large weights
    heartbeat_timeout_seconds: float = 5.0
    exit_timeout_seconds: float = 30.0
    # Restart policy: back-off doubling from `restart_backoff_seconds`; more than `max_restarts`
    # failures within `restart_window_seconds` marks the instance FAILED (no respawn loop).
    max_restarts: int = 5
    restart_window_seconds: float = 60.0
    restart_backoff_seconds: float = 0.1
    restart_backoff_max_seconds: float = 5.0
    # The logical ids of the visible GPUs (pystub_backend.devices, found once at start-up): where
    # KIND_GPU and KIND_AUTO instances may run.
    gpus: tuple[int, ...] = ()


def positive_number(text: str, kind: type[_Number]) -> _Number:
    """`text` as a positive int or float. Raises ValueError saying what is wrong with it."""
    try:
        number = kind(text)
    except ValueError:
        raise ValueError(f"must be {'an integer' if kind is int else 'a number'}, got '{text}'") from None
    if number <= 0:
        raise ValueError(f"must be positive, got '{text}'")
    return number


def _positive(key: str, value: str, kind: type[_Number]) -> _Number:
    try:
        return positive_number(value, kind)
    except ValueError as exc:
        raise BackendConfigError(f"backend config '{key}' {exc}") from None


def parse_backend_config(entries: list[str], settings: StubSettings | None = None) -> StubSettings:
    """Apply `python,key=value` entries. Entries for other backends are ignored.

    Raises BackendConfigError for malformed entries, unknown keys and invalid values.
    """
    settings = settings or StubSettings()
    for entry in entries:
        backend, _, assignment = entry.partition(",")
        key, equals, value = assignment.partition("=")
        if not equals or not key:
            raise BackendConfigError(f"--backend-config option format is '<backend name>,<setting>=<value>'. "
                                     f"Got {entry}")
        if backend != "python":
            continue
        _apply(settings, key, value)
    return settings


def _apply(settings: StubSettings, key: str, value: str) -> None:
    if key == "shm-default-byte-size":
        size = _positive(key, value, int)
        if size < MIB:
            raise BackendConfigError("shm-default-byte-size can't be smaller than 4 MiBs")
        settings.shm_default_byte_size = size
    elif key == "shm-growth-byte-size":
        settings.shm_growth_byte_size = _positive(key, value, int)
    elif key == "shm-region-prefix-name":
        if not value:
            raise BackendConfigError("shm-region-prefix-name must not be empty")
        try:
            settings.shm_prefix = validate_prefix(value.rstrip("_") or value)
        except ValueError as exc:
            raise BackendConfigError(str(exc)) from None
    elif key == "shm_message_queue_size":
        settings.message_queue_size = _positive(key, value, int)
    elif key == "thread-pool-size":
        settings.thread_pool_size = _positive(key, value, int)
    elif key == "stub-timeout-seconds":
        settings.stub_timeout_seconds = _positive(key, value, float)
    elif key == "stub-init-timeout-seconds":
        settings.stub_init_timeout_seconds = _positive(key, value, float)
    elif key == "stub-heartbeat-timeout-seconds":
        settings.heartbeat_timeout_seconds = _positive(key, value, float)
    elif key == "stub-max-restarts":
        settings.max_restarts = _positive(key, value, int)
    elif key == "stub-restart-window-seconds":
        settings.restart_window_seconds = _positive(key, value, float)
    else:
        raise BackendConfigError(f"unknown python backend config '{key}'")
