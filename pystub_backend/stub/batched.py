"""`execute_batch`: batched execution for model authors (a pystub extension, docs/batching.md#execute_batch).

A model may define `execute_batch(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]`
(sync or `async def`) instead of `execute`. For each batch the stub:

    requests ──▶ per request: its inputs, plus the config default of every optional input it
                 left out (a required input left out fails that request alone, INVALID_ARG)
             ──▶ groups of requests whose inputs concatenate (same names, dtypes, non-batch dims)
             ──▶ per group: inputs concatenated along dim 0, ONE execute_batch call, every output
                 split back by the requests' batch sizes
             ──▶ one InferenceResponse per request

An exception (or a malformed return) fails the requests of its group with Triton's batch-failure
text. Models with `max_batch_size: 0` have no batch dimension: execute_batch runs once per request.

Defaults are model parameters, `key: "default:<INPUT>" value: { string_value: "<JSON>" }`: a JSON
scalar or nested list, broadcast to the input's dims (a `-1` dim takes the default's own size).
They are checked when the model loads; a bad one fails the load with a message naming it.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from pystub_backend.ipc.status import Status
from pystub_backend.stub import pb_utils
from pystub_backend.stub.executor import failure_text, format_traceback
from pystub_backend.stub.loader import LoadError

__all__ = ["BatchedExecute", "BatchConfigError", "DEFAULT_PREFIX", "has_execute_batch", "parse_defaults"]

DEFAULT_PREFIX = "default:"


class BatchConfigError(LoadError):
    """The model's execute_batch cannot run with this config (the message says why)."""


def has_execute_batch(model_class: Any) -> bool:
    return callable(getattr(model_class, "execute_batch", None))


@dataclass(frozen=True)
class _Input:
    name: str
    dtype: Any
    optional: bool
    default: np.ndarray | None  # one batch element (batching models) or the whole tensor


def _dtype(data_type: str, where: str) -> Any:
    try:
        dtype = pb_utils.triton_string_to_numpy(data_type)
    except KeyError:
        raise BatchConfigError(f"{where}: data type {data_type} has no numpy equivalent") from None
    return np.object_ if dtype is np.object_ else np.dtype(dtype)


def _default_array(text: str, dtype: Any, dims: list[int], where: str) -> np.ndarray:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise BatchConfigError(f"{where} is not valid JSON ({exc}): {text!r}") from None
    try:
        if dtype is np.object_:  # BYTES: str elements become their UTF-8 bytes
            raw = np.asarray(value, dtype=object)
            array = np.empty(raw.shape, dtype=object)
            array.flat[:] = [v if isinstance(v, bytes) else str(v).encode("utf-8") for v in raw.flat]
        else:
            array = np.asarray(value, dtype=dtype)
    except (TypeError, ValueError, OverflowError) as exc:
        raise BatchConfigError(f"{where}: cannot convert {text} to {np.dtype(dtype).name} ({exc})") from None
    shape = list(dims)
    if -1 in dims:  # a variable dim takes the default's own size
        if array.ndim != len(dims):
            raise BatchConfigError(f"{where}: dims {dims} have a variable dim, so the default must have "
                                   f"{len(dims)} dim(s); got shape {list(array.shape)}")
        sizes: list[int] = [int(extent) for extent in np.shape(array)]
        shape = [size if dim == -1 else dim for size, dim in zip(sizes, dims, strict=True)]
    try:
        return np.ascontiguousarray(np.broadcast_to(array, shape))
    except ValueError:
        raise BatchConfigError(f"{where}: a value of shape {list(array.shape)} does not fit dims {dims}") from None


def parse_defaults(config: dict[str, Any]) -> dict[str, np.ndarray]:
    """The `default:<INPUT>` parameters of a model config (JSON form), checked against the
    inputs. Raises BatchConfigError naming the bad parameter."""
    inputs = {entry["name"]: entry for entry in config.get("input", [])}
    defaults = {}
    for key, value in (config.get("parameters") or {}).items():
        if not key.startswith(DEFAULT_PREFIX):
            continue
        name = key[len(DEFAULT_PREFIX):]
        where = f"config parameter '{key}' of model '{config.get('name', '')}'"
        entry = inputs.get(name)
        if entry is None:
            raise BatchConfigError(f"{where} names no input of the model")
        if not entry.get("optional", False):
            raise BatchConfigError(f"{where}: input '{name}' is not optional, so it cannot have a default")
        text = value.get("string_value", "") if isinstance(value, dict) else str(value)
        dtype = _dtype(entry.get("data_type", ""), where)
        defaults[name] = _default_array(text, dtype, [int(d) for d in entry.get("dims", [])], where)
    return defaults


class _RequestError(Exception):
    def __init__(self, message: str, code: Status = Status.INVALID_ARG) -> None:
        super().__init__(message)
        self.code = code


class BatchedExecute:
    """Runs a batch of requests through the model's `execute_batch`."""

    def __init__(self, config: dict[str, Any], instance: str) -> None:
        self.instance = instance
        self.model = config.get("name", "")
        self.batching = int(config.get("max_batch_size", 0)) > 0
        defaults = parse_defaults(config)
        self.inputs = [_Input(e["name"], _dtype(e.get("data_type", ""), f"input '{e['name']}'"),
                              bool(e.get("optional", False)), defaults.get(e["name"]))
                       for e in config.get("input", [])]

    @classmethod
    def create(cls, model_class: Any, config_json: str, instance: str, decoupled: bool) -> BatchedExecute | None:
        """None for a model without execute_batch. Raises BatchConfigError."""
        if not has_execute_batch(model_class):
            return None
        if decoupled:
            raise BatchConfigError(f"Python model '{instance}' defines execute_batch, which cannot be used with "
                                   "the decoupled transaction policy: define execute instead.")
        return cls(json.loads(config_json), instance)

    # -- per request ---------------------------------------------------------------------------
    def _arrays(self, request: Any) -> dict[str, np.ndarray]:
        """The request's inputs with defaults filled in. Raises _RequestError."""
        arrays: dict[str, np.ndarray] = {}
        for tensor in request.inputs():
            try:
                arrays[tensor.name()] = tensor.as_numpy()
            except Exception as exc:  # e.g. BF16, which numpy cannot hold
                raise _RequestError(f"input '{tensor.name()}': {exc}") from None
        size = next(iter(arrays.values())).shape[0] if self.batching and arrays else 1
        for spec in self.inputs:
            if spec.name in arrays:
                continue
            if spec.default is not None:
                default = spec.default
                arrays[spec.name] = (np.ascontiguousarray(np.broadcast_to(default, (size, *default.shape)))
                                     if self.batching else default)
            elif not spec.optional:
                raise _RequestError(f"input '{spec.name}' is required by model '{self.model}' but the request "
                                    f"does not provide it")
        return arrays

    def _key(self, arrays: dict[str, np.ndarray]) -> Any:
        return tuple((name, array.dtype.str, array.shape[1:]) for name, array in sorted(arrays.items()))

    # -- per batch -----------------------------------------------------------------------------
    def run(self, model: Any, requests: list[Any], submit: Callable[[Any], Any],
            log_error: Callable[[str], None]) -> list[Any]:
        """One InferenceResponse per request. `submit(coroutine)` runs an `async def
        execute_batch` to completion on the instance loop."""
        responses: list[Any] = [None] * len(requests)
        groups: dict[Any, list[tuple[int, dict[str, np.ndarray]]]] = {}
        for index, request in enumerate(requests):
            try:
                arrays = self._arrays(request)
            except _RequestError as exc:
                responses[index] = pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc), exc.code))
                continue
            key = self._key(arrays) if self.batching else index  # no batch dim: each runs alone
            groups.setdefault(key, []).append((index, arrays))
        for members in groups.values():
            self._run_group(model, members, responses, submit, log_error)
        return responses

    def _run_group(self, model: Any, members: list[tuple[int, dict[str, np.ndarray]]], responses: list[Any],
                   submit: Callable[[Any], Any], log_error: Callable[[str], None]) -> None:
        sizes = [next(iter(arrays.values())).shape[0] if self.batching and arrays else 1 for _, arrays in members]
        if len(members) == 1:
            inputs = members[0][1]
        else:
            inputs = {name: np.concatenate([arrays[name] for _, arrays in members]) for name in members[0][1]}
        try:
            outputs = model.execute_batch(inputs)
            if inspect.isawaitable(outputs):
                outputs = submit(outputs)
            split = self._split(self._check_outputs(outputs, sum(sizes)), sizes)
        except Exception as exc:
            text = failure_text(self.instance, exc)
            log_error(f"{text}\n{format_traceback(exc)}")
            split = [pb_utils.InferenceResponse(error=pb_utils.TritonError(text, Status.INTERNAL))] * len(members)
        for (index, _), response in zip(members, split, strict=True):
            responses[index] = response

    def _split(self, outputs: dict[str, np.ndarray], sizes: list[int]) -> list[Any]:
        """One response per request: its rows of every output."""
        if not self.batching:
            return [pb_utils.InferenceResponse([pb_utils.Tensor(name, array) for name, array in outputs.items()])]
        responses, start = [], 0
        for size in sizes:
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor(name, array[start:start + size]) for name, array in outputs.items()]))
            start += size
        return responses

    def _check_outputs(self, outputs: Any, total: int) -> dict[str, np.ndarray]:
        if not isinstance(outputs, dict):
            raise TypeError(f"execute_batch must return a dict of output name to numpy array, found type "
                            f"'{type(outputs)}'")
        for name, array in outputs.items():
            if not isinstance(name, str) or not isinstance(array, np.ndarray):
                raise TypeError(f"execute_batch must return a dict of output name to numpy array, found "
                                f"{type(name).__name__} -> {type(array).__name__}")
            if self.batching and (array.ndim == 0 or array.shape[0] != total):
                raise ValueError(f"output '{name}' of execute_batch has shape {list(array.shape)}, but the batch "
                                 f"has {total} element(s) along dim 0")
        return outputs

