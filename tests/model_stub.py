"""A real stub process running a model written inline by the test (no server around it)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.features.install import feature_services
from pystub_backend.backend.inference import InferRequest, InferResponse
from pystub_backend.backend.supervision.settings import StubSettings
from pystub_backend.backend.supervision.stub_process import StubProcess


@contextlib.asynccontextmanager
async def model_stub(directory: Path, name: str, source: str) -> AsyncIterator[StubProcess]:
    """Model `name` (version 1, no batching, not decoupled) whose model.py is `source`, written
    under `directory`, in an initialized stub `name_0`; finalized and stopped afterwards."""
    model_path = directory / name / "1" / "model.py"
    model_path.parent.mkdir(parents=True)
    model_path.write_text(source)
    stub = StubProcess(f"{name}_0", StubSettings(), name, feature_services(None))
    stub.spawn()
    try:
        config = json.dumps({"name": name, "backend": "python", "max_batch_size": 0})
        args = {"model_config": config, "model_instance_kind": "CPU", "model_instance_name": f"{name}_0",
                "model_instance_device_id": "0", "model_repository": str(directory / name),
                "model_version": "1", "model_name": name}
        await stub.initialize(str(model_path), args, {"decoupled": False})
        yield stub
    finally:
        await stub.stop(finalize_timeout=10.0)


async def execute(stub: StubProcess, requests: list[InferRequest]) -> list[InferResponse | ServerError]:
    """Run one batch on the stub: per request its one response, or why it failed, once the
    model's `execute` returned (as the schedulers send it, through the stub's exchange)."""
    assert stub.exchange is not None, "the stub was not spawned"
    submission = stub.exchange.submit(requests, wait=True)
    assert submission is not None  # wait=True always answers
    await submission.executed()
    results: list[InferResponse | ServerError] = []
    for outcome in submission.outcomes:
        if isinstance(outcome, ServerError):
            results.append(outcome)
            continue
        try:
            results.append(await outcome.single())
        except ServerError as error:
            results.append(error)
    return results
