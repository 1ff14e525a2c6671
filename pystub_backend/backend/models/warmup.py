"""`model_warmup`: run each sample on every instance before the model reports ready.

    load: start instances ──▶ samples = build_samples(config)   (data made once, shared)
                         ──▶ per instance, concurrently: for sample: for count: execute(requests)
                         ──▶ any failure fails the load (the scheduler never starts)

Semantics and texts are Triton 2.51's (checked against it):
- a sample is `batch_size` requests sent as one batch; with `max_batch_size > 0` each request
  has batch 1 (shape `[1] + dims`), otherwise shape `dims`; it runs `count` times (0 means once)
  on each instance, samples in config order. `batch_size: 0` skips the sample.
- `batch_size` above `max_batch_size` (above 1 for a non-batching model) fails every request
  with `batch size <n> for '<instance>', max allowed is <m>`;
- `zero_data` is zeros (empty strings for BYTES), `random_data` random bytes (empty strings for
  BYTES), `input_data_file` the raw bytes of `<model dir>/warmup/<file>` (BYTES: the
  length-prefixed form);
- inputs the config does not name are passed on to the model; a request is otherwise checked
  as an inference request is, with `<id_unknown>` as its id;
- a failed execute or error response fails the load with `failed to run warmup sample '<name>':
  <error>; ` (one `<error>; ` per failed request).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from tritonclient.grpc import model_config_pb2

from pystub_backend.backend.config.model_config import ModelConfig
from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.inference import InferRequest, InferResponse, Tensor
from pystub_backend.backend.models.validation import validate_request
from pystub_backend.backend.supervision.exchange import Submission
from pystub_backend.ipc.dtypes import WIRE_TO_NUMPY, config_to_wire, numpy_dtype

__all__ = ["WarmupError", "WarmupSample", "WarmupInstance", "build_samples", "run_warmup"]

log = logging.getLogger("pystub.model")

_NO_ID = "[request id: <id_unknown>] "
_DATATYPES = frozenset(WIRE_TO_NUMPY) - {"BF16"}  # what numpy can make data for


class WarmupError(Exception):
    """A warmup sample could not be built or failed to run; the message is Triton's text."""


class _Killable(Protocol):
    def kill(self) -> None: ...


class WarmupInstance(Protocol):
    """What warmup needs of a model instance (a supervision.instance.ModelInstance)."""

    name: str

    @property
    def stub(self) -> _Killable | None: ...

    def submit(self, requests: list[InferRequest], *, wait: bool) -> Submission | None: ...


@dataclass(frozen=True)
class WarmupSample:
    name: str
    batch_size: int
    count: int
    inputs: tuple[Tensor, ...]  # one request's inputs (batch 1 when the model batches)


def build_samples(config: ModelConfig, model_dir: str) -> list[WarmupSample]:
    """Every sample of `config.model_warmup`, its data made. Raises WarmupError."""
    samples = []
    for setting in config.model_warmup:
        if setting.batch_size == 0:
            log.info("Skipping batch 0 warmup sample '%s'", setting.name)
            continue
        log.debug("Generating warmup sample data for '%s'", setting.name)
        batched = config.max_batch_size > 0
        inputs = tuple(_input(name, spec, model_dir, batched) for name, spec in sorted(setting.inputs.items()))
        samples.append(WarmupSample(setting.name, setting.batch_size, max(setting.count, 1), inputs))
    return samples


def _input(name: str, spec: model_config_pb2.ModelWarmup.Input, model_dir: str, batched: bool) -> Tensor:
    source = spec.WhichOneof("input_data_type")
    if source is None:
        raise WarmupError(f"{_NO_ID}warmup setting expects input '{name}' to have input_data_type set")
    datatype = config_to_wire(model_config_pb2.DataType.Name(spec.data_type))
    dims = tuple(int(d) for d in spec.dims)
    count = int(np.prod(dims, dtype=np.int64))
    if datatype not in _DATATYPES:
        raise WarmupError(f"{_NO_ID}warmup setting for input '{name}' has an unsupported data type "
                          f"'{model_config_pb2.DataType.Name(spec.data_type)}'")
    if source == "input_data_file":
        data = _file_data(model_dir, spec.input_data_file, datatype, count)
    elif datatype == "BYTES":  # Triton sends empty strings for zero and random data alike
        data = b"\0\0\0\0" * count
    elif source == "zero_data":
        data = bytes(count * numpy_dtype(datatype).itemsize)
    else:
        data = _random_data(datatype, count)
    return Tensor(name, datatype, ((1,) if batched else ()) + dims, data)


def _random_data(datatype: str, count: int) -> bytes:
    if datatype == "BOOL":  # random bytes would not be valid booleans
        return np.random.default_rng().integers(0, 2, count, dtype=np.uint8).tobytes()
    return os.urandom(count * numpy_dtype(datatype).itemsize)


def _file_data(model_dir: str, file_name: str, datatype: str, count: int) -> bytes:
    path = os.path.join(model_dir, "warmup", file_name)
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise WarmupError(f"failed to open text file for read {path}: {exc.strerror}") from None
    if datatype == "BYTES":
        return data
    expected = count * numpy_dtype(datatype).itemsize
    if len(data) < expected:  # (sic) Triton's text has no space after the file name
        raise WarmupError(f"{_NO_ID}warmup setting expects {expected} bytes, but the data provided from "
                          f"{file_name}only has {len(data)} bytes")
    return data[:expected]


def _requests(config: ModelConfig, sample: WarmupSample) -> list[InferRequest]:
    """The sample's batch; each request checked as an inference request. Raises WarmupError."""
    known = {tensor.name for tensor in config.input}
    requests = []
    for _ in range(sample.batch_size):
        request = InferRequest(config.name, inputs=list(sample.inputs))
        checked = InferRequest(config.name, inputs=[t for t in sample.inputs if t.name in known])
        try:  # inputs the config does not name go to the model unchecked, as in Triton
            validate_request(checked, config)
        except ServerError as exc:
            raise WarmupError(exc.message) from None
        requests.append(request)
    return requests


async def _run_sample(config: ModelConfig, instance: WarmupInstance, sample: WarmupSample,
                      timeout: float) -> None:
    limit = config.max_batch_size
    if sample.batch_size > max(limit, 1):
        error = f"batch size {sample.batch_size} for '{instance.name}', max allowed is {limit}; "
        raise WarmupError(f"failed to run warmup sample '{sample.name}': {error * sample.batch_size}")
    for iteration in range(1, sample.count + 1):
        log.info("model '%s' instance %s is running warmup sample '%s' for iteration %d", config.name,
                 instance.name, sample.name, iteration)
        requests = _requests(config, sample)
        errors = await _execute(instance, requests, timeout, sample.name)
        if errors:
            log.info("model '%s' instance %s failed to run warmup sample '%s'", config.name, instance.name,
                     sample.name)
            raise WarmupError(f"failed to run warmup sample '{sample.name}': " + "".join(f"{e}; " for e in errors))


async def _answers(instance: WarmupInstance, requests: list[InferRequest]) -> list[InferResponse | ServerError]:
    """Per request its one response, or why it failed, once the model's `execute` returned."""
    submission = instance.submit(requests, wait=True)
    assert submission is not None  # wait=True always answers
    await submission.executed()
    results: list[InferResponse | ServerError] = []
    for outcome in submission.outcomes:
        try:
            results.append(outcome if isinstance(outcome, ServerError) else await outcome.single())
        except ServerError as error:
            results.append(error)
    return results


async def _execute(instance: WarmupInstance, requests: list[InferRequest], timeout: float, sample: str) -> list[str]:
    """Run one batch on the instance; the error texts of the requests that failed."""
    stub = instance.stub
    if stub is None:
        return [f"Stub process '{instance.name}' is not healthy."] * len(requests)
    try:
        results = await asyncio.wait_for(_answers(instance, requests), timeout)
    except asyncio.TimeoutError:
        # The model is stuck in execute: kill the stub now (the failed load then stops it).
        stub.kill()
        raise WarmupError(f"timed out after {timeout:g} s waiting for warmup sample '{sample}' on instance "
                          f"'{instance.name}'") from None
    errors = []
    for result in results:
        if isinstance(result, ServerError):
            errors.append(result.message)
            continue
        if result.error is not None:
            errors.append(result.error.message)
        result.release()
    return errors


async def run_warmup(config: ModelConfig, model_dir: str, instances: Sequence[WarmupInstance],
                     timeout: float) -> None:
    """Warm every instance up (concurrently), each sample in order. Raises WarmupError; each
    execute is bounded by `timeout` seconds."""
    if not config.model_warmup:
        return

    async def warm(instance: WarmupInstance) -> None:
        for sample in build_samples(config, model_dir):  # per instance, as Triton: own random data
            await _run_sample(config, instance, sample, timeout)

    results = await asyncio.gather(*(warm(instance) for instance in instances), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
