"""Explicit model control from a model: the stub's `_runtime.ModelControl` (docs/reference/model-api.md#model-control).

`pb_utils.load_model / unload_model / is_model_ready` check their arguments and call this; it
sends a ModelControl frame and waits for the backend's answer (Core.load_model, unload_model,
model_ready). The backend refuses every mode but explicit with Triton's own text. Enabled from
before `initialize` until `finalize` (so never in `auto_complete_config` or `finalize`).

Waits have deadlines: a load or unload may take as long as a model's `initialize`, so it waits up
to LOAD_TIMEOUT_SECONDS (or the stub timeout, if longer); a readiness query the stub timeout.
"""

from __future__ import annotations

import itertools
import queue
import threading
from typing import Any

from pystub_backend.ipc.messages.bls import ModelControl, ModelControlDone
from pystub_backend.stub.handlers import StubHandlers
from pystub_backend.stub.pb_utils import _runtime

__all__ = ["ModelControlClient", "LOAD_TIMEOUT_SECONDS", "register", "takes_device_inputs"]

LOAD_TIMEOUT_SECONDS = 600.0


class ModelControlError(Exception):
    """The server refused or failed the operation; the text is its reason."""


class ModelControlClient:
    def __init__(self, stub: Any) -> None:
        self._stub = stub
        self._tokens = itertools.count(1)
        self._waiters: dict[int, queue.SimpleQueue[ModelControlDone]] = {}
        self._lock = threading.Lock()

    def load_model(self, name: str, config: str, files: dict[str, bytes] | None) -> None:
        self._call("load", {"name": name, "config": config, "files": {k: bytes(v) for k, v in (files or {}).items()}},
                   self._long_timeout(), f"loading model '{name}'")

    def unload_model(self, name: str, unload_dependents: bool) -> None:
        self._call("unload", {"name": name, "unload_dependents": unload_dependents}, self._long_timeout(),
                   f"unloading model '{name}'")

    def is_model_ready(self, name: str, version: str) -> bool:
        return bool(self._call("ready", {"name": name, "version": version}, self._stub.options.send_timeout,
                               f"the readiness of model '{name}'"))

    def takes_device_inputs(self, name: str, version: str, device_id: int) -> bool:
        """Whether a BLS call may hand model `name` its GPU inputs on `device_id` as they are
        (False when the server cannot say, e.g. for an unknown model)."""
        try:
            return bool(self._call("device_inputs", {"name": name, "version": version, "device": device_id},
                                   self._stub.options.send_timeout, f"whether model '{name}' takes GPU inputs"))
        except (ModelControlError, TimeoutError):
            return False

    def _long_timeout(self) -> float:
        return max(LOAD_TIMEOUT_SECONDS, self._stub.options.send_timeout)

    def _call(self, operation: str, arguments: dict[str, Any], timeout: float, what: str) -> Any:
        """The result. Raises ModelControlError with the server's reason, TimeoutError, or the
        channel's errors (pb_utils turns each into TritonModelException with its prefix)."""
        token = next(self._tokens)
        waiter: queue.SimpleQueue[ModelControlDone] = queue.SimpleQueue()
        with self._lock:
            self._waiters[token] = waiter
        try:
            self._stub.send(ModelControl(token, operation, arguments))
            try:
                reply = waiter.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"the server did not finish {what} within {timeout:g} s") from None
        finally:
            with self._lock:
                self._waiters.pop(token, None)
        if reply.error is not None:
            raise ModelControlError(reply.error)
        return reply.result

    def on_done(self, message: ModelControlDone) -> None:
        with self._lock:
            waiter = self._waiters.get(message.token)
        if waiter is not None:
            waiter.put(message)


_client: ModelControlClient | None = None


def takes_device_inputs(name: str, version: str, device_id: int) -> bool:
    """`ModelControlClient.takes_device_inputs` of this stub's client (False before it exists)."""
    return _client is not None and _client.takes_device_inputs(name, version, device_id)


def _enable(stub: Any) -> None:
    global _client
    if _client is None:
        _client = ModelControlClient(stub)
    _runtime.set_model_control(_client)


def _forget(stub: Any) -> None:
    """A forked instance: the client of its template's stub is not this process's; its own
    phases make a new one."""
    global _client
    _client = None


def _disable(stub: Any) -> None:
    _runtime.set_model_control(None)


def _on_done(stub: Any, message: ModelControlDone) -> None:
    if _client is not None:
        _client.on_done(message)


def register(handlers: StubHandlers) -> None:
    """Wire model control into a stub: the pb_utils client while the model lives, its replies."""
    handlers.awaits_reply(ModelControl)
    handlers.on_phase("initializing", _enable)
    handlers.on_phase("finalizing", _disable)
    handlers.on_phase("forked", _forget)
    handlers.on_receiver(ModelControlDone, _on_done)
