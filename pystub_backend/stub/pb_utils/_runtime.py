"""Hooks through which the stub connects pb_utils to the server.

pb_utils never talks to the server itself. The stub installs these hooks once its channel to the
backend is up (and removes them when a phase such as `execute` ends); until then each feature
falls back to what the original does before its stub is connected: logs go to stderr, BLS and
model control are refused, metrics stay local.

The hooks are plain module globals: there is one stub per process and it owns them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

__all__ = [
    "LogSink",
    "BlsHandler",
    "ModelControl",
    "MetricReporter",
    "set_log_sink",
    "log_sink",
    "set_bls_handler",
    "set_output_allocator",
    "output_allocator",
    "bls_handler",
    "set_model_control",
    "model_control",
    "set_metric_reporter",
    "metric_reporter",
    "set_model_dir",
    "model_dir",
    "set_instance_name",
    "instance_name",
    "set_shm_free_memory",
    "shm_free_memory",
    "Multiplexer",
    "set_multiplexer",
    "multiplexer",
    "reset",
]

LogSink = Callable[[int, str, str, int], None]
"""`fn(level, message, filename, lineno)`; `level` is an int `Logger.LogLevel`, `filename` the
caller's full path (the server log shows its basename)."""


class BlsHandler(Protocol):
    """Runs BLS requests; returns what `InferenceRequest.exec/async_exec` return."""

    def exec(self, request: Any, decoupled: bool) -> Any: ...

    def async_exec(self, request: Any, decoupled: bool) -> Any: ...


class ModelControl(Protocol):
    """Explicit model control. Raise any exception whose `str()` is the reason for a failure;
    pb_utils adds the `Failed to load model: ` / `Failed to unload model: ` prefixes."""

    def load_model(self, name: str, config: str, files: dict[str, bytes] | None) -> None: ...

    def unload_model(self, name: str, unload_dependents: bool) -> None: ...

    def is_model_ready(self, name: str, version: str) -> bool: ...


class MetricReporter(Protocol):
    """Mirrors local metric state to the server. Every method is optional (missing ones are
    skipped). Raising makes the pb_utils call fail with its prefix
    (docs/reference/model-api.md#custom-metrics)."""

    def family_created(self, name: str, description: str, kind: int) -> None: ...

    def metric_created(self, family: str, labels: dict[str, str], buckets: list[float] | None) -> None: ...

    def metric_operation(self, family: str, labels: dict[str, str], op: str, value: float) -> None: ...

    def metric_deleted(self, family: str, labels: dict[str, str]) -> None: ...

    def metric_value(self, family: str, labels: dict[str, str]) -> float:
        """The server's value of a COUNTER or GAUGE series (`Metric.value()`); when missing,
        `value()` answers from local state."""
        ...


class Multiplexer(Protocol):
    """The instance's sub-model cache (model multiplexing); both raise TritonModelException."""

    def get(self, model_id: str) -> Any: ...

    async def async_get(self, model_id: str) -> Any: ...


_log_sink: LogSink | None = None
_bls_handler: BlsHandler | None = None
_model_control: ModelControl | None = None
_metric_reporter: MetricReporter | None = None
_model_dir: str | None = None
_instance_name = ""
_shm_free_memory: Callable[[], int] | None = None
_multiplexer: Multiplexer | None = None
_output_allocator: Callable[[Any, Any], Any] | None = None


def set_log_sink(fn: LogSink | None) -> None:
    """Route `Logger` records to `fn`; `None` restores the glog-style stderr fallback."""
    global _log_sink
    _log_sink = fn


def log_sink() -> LogSink | None:
    return _log_sink


def set_bls_handler(handler: BlsHandler | None) -> None:
    """Enable BLS (set during `execute`); `None` refuses it again."""
    global _bls_handler
    _bls_handler = handler


def bls_handler() -> BlsHandler | None:
    return _bls_handler


def set_model_control(handler: ModelControl | None) -> None:
    """Enable `load_model`/`unload_model`/`is_model_ready`; `None` refuses them."""
    global _model_control
    _model_control = handler


def model_control() -> ModelControl | None:
    return _model_control


def set_metric_reporter(reporter: MetricReporter | None) -> None:
    """Mirror metric changes to `reporter`; `None` keeps metrics local only."""
    global _metric_reporter
    _metric_reporter = reporter


def metric_reporter() -> MetricReporter | None:
    return _metric_reporter


def set_model_dir(path: str | None) -> None:
    """The version directory returned by `pb_utils.get_model_dir()`."""
    global _model_dir
    _model_dir = path


def model_dir() -> str | None:
    return _model_dir


def set_instance_name(name: str) -> None:
    """The model instance this process runs (`<model>_<n>`), named in texts the server would write."""
    global _instance_name
    _instance_name = name


def instance_name() -> str:
    return _instance_name


def set_shm_free_memory(fn: Callable[[], int] | None) -> None:
    """Probe behind `c_python_backend_utils.shared_memory.free_memory()`."""
    global _shm_free_memory
    _shm_free_memory = fn


def shm_free_memory() -> int:
    """Free bytes reported by the probe, 0 when none is set."""
    return int(_shm_free_memory()) if _shm_free_memory is not None else 0


def set_output_allocator(fn: Callable[[Any, Any], Any] | None) -> None:
    """Install the stub's arena allocator behind `pb_utils.new_output_array`."""
    global _output_allocator
    _output_allocator = fn


def output_allocator() -> Callable[[Any, Any], Any] | None:
    return _output_allocator


def set_multiplexer(cache: Multiplexer | None) -> None:
    """The cache behind `pb_utils.get_multiplexed_model`; `None` disables multiplexing."""
    global _multiplexer
    _multiplexer = cache


def multiplexer() -> Multiplexer | None:
    return _multiplexer


def reset() -> None:
    """Remove every hook (stub shutdown, tests)."""
    set_log_sink(None)
    set_bls_handler(None)
    set_model_control(None)
    set_metric_reporter(None)
    set_output_allocator(None)
    set_model_dir(None)
    set_instance_name("")
    set_shm_free_memory(None)
    set_multiplexer(None)
