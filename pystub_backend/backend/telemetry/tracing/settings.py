"""Trace settings: `--trace-config` (and the deprecated `--trace-*` flags) and the settings store
behind `/v2/trace/setting`, `/v2/models/<m>/trace/setting` and gRPC `TraceSetting`.

The shapes and texts are Triton 2.51's (checked against the real server):

    --trace-config <setting>=<value>                 level, rate, count, mode (global)
    --trace-config triton,<setting>=<value>          file, log-frequency (triton mode)
    --trace-config opentelemetry,<setting>=<value>   url, resource (k=v, repeatable),
                                                     bsp_max_queue_size, bsp_schedule_delay,
                                                     bsp_max_export_batch_size

A model's settings are the global ones with the model's own updates on top; an update with a null
value clears that setting (the global one returns to its start-up value, a model's to the
global). Updates are strings (trace_level a list of strings), as Triton's JSON parser wants.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TraceConfig", "TraceConfigError", "TraceSettingError", "TraceSettingsStore", "parse_trace_config",
           "LEVELS", "MODES"]

LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")
MODES = ("triton", "opentelemetry")
_GLOBAL = ("level", "rate", "count", "mode")
_TRITON = ("file", "log-frequency")
_OTEL = ("url", "resource", "bsp_max_queue_size", "bsp_schedule_delay", "bsp_max_export_batch_size")
_FORMAT = "--trace-config option format is '<trace mode>,<setting>=<value>'. Got "


class TraceConfigError(ValueError):
    """A bad --trace-config (a usage error at start-up)."""


class TraceSettingError(ValueError):
    """A bad settings update; `status` is the HTTP status Triton answers with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class TraceConfig:
    """What the command line decided; `TraceSettingsStore` starts from it."""

    level: tuple[str, ...] = ("OFF",)
    rate: int = 1000
    count: int = -1
    mode: str = "triton"
    file: str = ""
    log_frequency: int = 0
    url: str = "http://localhost:4318/v1/traces"  # Triton's (and OTLP's) default
    resource: tuple[tuple[str, str], ...] = ()
    bsp_max_queue_size: int = 2048
    bsp_schedule_delay_ms: int = 5000
    bsp_max_export_batch_size: int = 512
    given: frozenset[str] = frozenset()  # opentelemetry settings named on the command line

    @property
    def opentelemetry(self) -> bool:
        return self.mode == "opentelemetry"


def _int(setting: str, text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise TraceConfigError(f"--trace-config {setting}: expected a whole number, got '{text}'") from None
    if value < minimum:
        raise TraceConfigError(f"--trace-config {setting}: expected a number >= {minimum}, got '{text}'")
    return value


def _level(text: str) -> str:
    upper = text.strip().upper()
    if upper not in LEVELS:
        raise TraceConfigError(f"--trace-config level: expected one of {', '.join(LEVELS)}, got '{text}'")
    return upper


def _split(entry: str) -> tuple[str, str, str]:
    """(mode or "", setting, value) of one --trace-config entry."""
    head, comma, rest = entry.partition(",")
    mode, pair = (head.strip(), rest) if comma else ("", entry)
    name, equals, value = pair.partition("=")
    if not equals or not name.strip():
        raise TraceConfigError(_FORMAT + entry if comma else f"No trace mode specified. {_FORMAT}{entry}")
    name = name.strip()
    allowed = {"": _GLOBAL, "triton": _TRITON, "opentelemetry": _OTEL}.get(mode)
    if allowed is None or name not in allowed:
        where = f"{mode}," if mode else ""
        raise TraceConfigError(f'Bad option: "--trace-config {where}{name}"')
    return mode, name, value.strip()


def parse_trace_config(entries: list[str], deprecated: list[tuple[str, str]] | None = None) -> TraceConfig:
    """The config of --trace-config entries; `deprecated` holds the old flags' (setting, value)
    pairs (level, rate, count, file, log-frequency), which --trace-config overrides.
    Raises TraceConfigError."""
    values: dict[str, object] = {}
    levels: list[str] = []
    resource: list[tuple[str, str]] = []
    given: set[str] = set()
    for name, value in deprecated or []:
        _apply(values, levels, resource, given, "triton" if name in _TRITON else "", name, value)
    config_levels: list[str] = []
    for entry in entries:
        mode, name, value = _split(entry)
        _apply(values, config_levels, resource, given, mode, name, value)
    if config_levels:
        levels = config_levels
    if levels:
        values["level"] = ("OFF",) if levels == ["OFF"] else tuple(dict.fromkeys(v for v in levels if v != "OFF"))
    return TraceConfig(**values, resource=tuple(resource), given=frozenset(given))  # type: ignore[arg-type]


def _apply(values: dict[str, object], levels: list[str], resource: list[tuple[str, str]], given: set[str],
           mode: str, name: str, value: str) -> None:
    if name == "level":
        levels.append(_level(value))
    elif name in ("rate", "bsp_max_queue_size", "bsp_max_export_batch_size"):
        values[name] = _int(name, value, 1)
    elif name == "count":
        values[name] = _int(name, value, -1)
    elif name == "bsp_schedule_delay":
        values["bsp_schedule_delay_ms"] = _int(name, value, 0)
    elif name == "log-frequency":
        values["log_frequency"] = _int(name, value, 0)
    elif name == "mode":
        if value not in MODES:
            raise TraceConfigError(f"--trace-config mode: expected one of {', '.join(MODES)}, got '{value}'")
        values["mode"] = value
    elif name == "resource":
        key, equals, item = value.partition("=")
        if not equals or not key:
            raise TraceConfigError(f"--trace-config opentelemetry,resource expects <key>=<value>, got '{value}'")
        resource.append((key, item))
    else:  # file, url
        values[name] = value
    if mode == "opentelemetry":
        given.add(name)


@dataclass
class _Values:
    level: tuple[str, ...]
    rate: int
    count: int
    log_frequency: int


class TraceSettingsStore:
    """The settings in force: global, and per model. Not thread-safe: the event loop owns it."""

    def __init__(self, config: TraceConfig) -> None:
        self.config = config
        self._start = _Values(config.level, config.rate, config.count, config.log_frequency)
        self._global: dict[str, object] = {}
        self._models: dict[str, dict[str, object]] = {}

    def value(self, name: str, model: str = "") -> object:
        """One of level, rate, count, log_frequency as in force for `model` ("" = global)."""
        if model and name in self._models.get(model, {}):
            return self._models[model][name]
        return self._global.get(name, getattr(self._start, name))

    def as_json(self, model: str = "") -> dict[str, object]:
        """The settings in Triton's HTTP shape (every value a string, trace_level a list)."""
        config = self.config
        answer: dict[str, object] = {
            "trace_level": list(self.value("level", model)),  # type: ignore[call-overload]
            "trace_rate": str(self.value("rate", model)),
            "trace_count": str(self.value("count", model)),
        }
        if config.opentelemetry:
            answer["trace_mode"] = "opentelemetry"
            answer["url"] = config.url
            if config.resource:
                answer["resource"] = ",".join(f"{k}={v}" for k, v in config.resource)
            if "bsp_schedule_delay" in config.given:
                answer["bsp_schedule_delay"] = str(config.bsp_schedule_delay_ms)
            answer["bsp_max_export_batch_size"] = str(config.bsp_max_export_batch_size)
            answer["bsp_max_queue_size"] = str(config.bsp_max_queue_size)
        else:
            answer["log_frequency"] = str(self.value("log_frequency", model))
            answer["trace_file"] = config.file
            answer["trace_mode"] = "triton"
        return answer

    def update(self, body: dict[str, object], model: str = "") -> dict[str, object]:
        """Apply a settings update (all or nothing) and return the settings after it.
        Raises TraceSettingError with Triton's text and status."""
        parsed = _parse_update(body)
        target = self._models.setdefault(model, {}) if model else self._global
        for name, value in parsed.items():
            if value is None:
                target.pop(name, None)
            else:
                target[name] = value
        return self.as_json(model)

    def any_model_level_on(self) -> bool:
        return any(values.get("level", ("OFF",)) != ("OFF",) for values in self._models.values())

    def has_own_sampling(self, model: str) -> bool:
        """The model has its own rate or count (and so its own sampling counters)."""
        own = self._models.get(model)
        return bool(own) and ("rate" in own or "count" in own)  # type: ignore[operator]


_UPDATABLE = {"trace_level": "level", "trace_rate": "rate", "trace_count": "count", "log_frequency": "log_frequency"}


def _parse_update(body: dict[str, object]) -> dict[str, object]:
    if "trace_file" in body:
        raise TraceSettingError("trace file location can not be updated through network protocol", 501)
    parsed: dict[str, object] = {}
    for key, name in _UPDATABLE.items():
        if key not in body:
            continue
        value = body[key]
        if value is None:
            parsed[name] = None
        elif name == "level":
            parsed[name] = _update_level(value)
        else:
            parsed[name] = _update_number(key, value, {"rate": 1, "count": -1, "log_frequency": 0}[name])
    return parsed


def _update_level(value: object) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise TraceSettingError("attempt to access JSON non-array as array", 500)
    levels = []
    for item in value:
        if not isinstance(item, str):
            raise TraceSettingError("attempt to access JSON non-string as string", 500)
        if item.upper() not in LEVELS:
            raise TraceSettingError(f"Unable to parse 'trace_level', got: {item}")
        levels.append(item.upper())
    if not levels:
        raise TraceSettingError("Unable to parse 'trace_level', got an empty list")
    return ("OFF",) if levels == ["OFF"] else tuple(dict.fromkeys(v for v in levels if v != "OFF"))


def _update_number(key: str, value: object, minimum: int) -> int:
    if not isinstance(value, str):
        raise TraceSettingError("attempt to access JSON non-string as string", 500)
    try:
        number = int(value)
    except ValueError:
        raise TraceSettingError(f"Unable to parse '{key}', got: {value}") from None
    if number < minimum:
        raise TraceSettingError(f"Unable to parse '{key}'. Expecting value >= {minimum}, got:{value}")
    return number

