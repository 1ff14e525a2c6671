"""Send one request to a server and reduce the answer to plain data that two servers can share.

Every helper returns an `Outcome`-like dict: `{"ok": ...}` with outputs as (datatype, shape,
values) or `{"status": ..., "error": ...}`. Two servers agree when the dicts are equal. Raw HTTP
(`raw`) is for what tritonclient hides: status codes, headers, bodies of errors.
"""

from __future__ import annotations

import http.client
import json
import queue
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, Union

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from oracle import Endpoint, Pair
from oracle_faults import OracleUnavailable
from tritonclient.utils import InferenceServerException

_TIMEOUT = 60.0
Plain = Union[dict, list, str, int, float, bool, None]
T = TypeVar("T")


@dataclass
class Reply:
    """One raw HTTP exchange."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:  # noqa: ANN401 - a JSON document: its shape is what the tests compare
        return json.loads(self.body) if self.body else None


def raw(endpoint: Endpoint, method: str, path: str, body: bytes | Plain = None,
        headers: dict[str, str] | None = None, port: int | None = None) -> Reply:
    """One HTTP request on a fresh connection (closed afterwards)."""
    connection = http.client.HTTPConnection("127.0.0.1", port or endpoint.http_port, timeout=_TIMEOUT)
    try:
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        connection.request(method, path, body=data, headers=headers or {})
        response = connection.getresponse()
        return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
    finally:
        connection.close()


Tensor = tuple[str, np.ndarray, str]   # name, data, datatype


def _outputs(result: object, names: Sequence[str]) -> dict[str, list]:
    """Each named output as [dtype, shape, values] (BYTES decoded as UTF-8 with replacement)."""
    out: dict[str, list] = {}
    for name in names:
        array = result.as_numpy(name)  # type: ignore[attr-defined]
        if array is None:
            out[name] = ["absent"]
            continue
        values = [v.decode(errors="replace") if isinstance(v, bytes) else v for v in array.reshape(-1).tolist()]
        out[name] = [str(array.dtype) if array.dtype != np.object_ else "object", list(array.shape), values]
    return out


def http_infer(endpoint: Endpoint, model: str, tensors: Sequence[Tensor], outputs: Sequence[str],
               binary: bool = True, binary_outputs: bool = True, timeout: float = _TIMEOUT, **options: object) -> dict:
    """tritonclient.http infer; the outputs, or the error's status and message, or {"timeout": s}
    when no answer came within `timeout` seconds."""
    client = httpclient.InferenceServerClient(endpoint.http_url, network_timeout=timeout)
    try:
        inputs = []
        for name, data, datatype in tensors:
            tensor = httpclient.InferInput(name, list(data.shape), datatype)
            tensor.set_data_from_numpy(data, binary_data=binary)
            inputs.append(tensor)
        requested = [httpclient.InferRequestedOutput(n, binary_data=binary_outputs) for n in outputs]
        result = client.infer(model, inputs, outputs=requested or None, **options)
        return {"ok": _outputs(result, outputs)}
    except InferenceServerException as error:
        return {"status": error.status(), "error": error.message()}
    except TimeoutError:
        return {"timeout": timeout}
    finally:
        client.close()


def grpc_infer(endpoint: Endpoint, model: str, tensors: Sequence[Tensor], outputs: Sequence[str],
               timeout: float = _TIMEOUT, **options: object) -> dict:
    """tritonclient.grpc infer; the outputs, or the error's status and message, or {"timeout": s}
    when no answer came within `timeout` seconds."""
    client = grpcclient.InferenceServerClient(endpoint.grpc_url)
    try:
        inputs = []
        for name, data, datatype in tensors:
            tensor = grpcclient.InferInput(name, list(data.shape), datatype)
            tensor.set_data_from_numpy(data)
            inputs.append(tensor)
        requested = [grpcclient.InferRequestedOutput(n) for n in outputs]
        result = client.infer(model, inputs, outputs=requested or None, client_timeout=timeout,
                              **options)
        return {"ok": _outputs(result, outputs)}
    except InferenceServerException as error:
        if error.status() == "StatusCode.DEADLINE_EXCEEDED":
            return {"timeout": timeout}
        return {"status": error.status(), "error": error.message()}
    finally:
        client.close()


def grpc_stream(endpoint: Endpoint, model: str, requests: Sequence[Sequence[Tensor]], outputs: Sequence[str],
                expected_finals: int | None = None, with_ids: bool = False) -> list[dict]:
    """Send `requests` on one gRPC stream; collect every response (empty finals included) until
    each request got its final response. Raises AssertionError naming what it waited for.
    `with_ids`: request k has the id "k", and each response records the id it carries (how
    responses of several requests interleave depends on whether one execute got them all)."""
    client = grpcclient.InferenceServerClient(endpoint.grpc_url)
    received: queue.Queue[tuple[object, object]] = queue.Queue()
    try:
        client.start_stream(callback=lambda result, error: received.put((result, error)))
        for index, tensors in enumerate(requests):
            inputs = []
            for name, data, datatype in tensors:
                tensor = grpcclient.InferInput(name, list(data.shape), datatype)
                tensor.set_data_from_numpy(data)
                inputs.append(tensor)
            client.async_stream_infer(model, inputs, request_id=str(index) if with_ids else "",
                                      enable_empty_final_response=True)
        finals, collected = 0, list[dict]()
        while finals < (expected_finals if expected_finals is not None else len(requests)):
            try:
                result, error = received.get(timeout=_TIMEOUT)
            except queue.Empty:
                raise AssertionError(f"{endpoint.name}: no final response from '{model}' on the stream "
                                     f"within {_TIMEOUT} s; got {collected}") from None
            if error is not None:
                collected.append({"status": error.status(), "error": error.message()})  # type: ignore[attr-defined]
                finals += 1   # an error ends its request on the stream
                continue
            response = result.get_response()  # type: ignore[attr-defined]
            final = response.parameters["triton_final_response"].bool_param
            finals += final
            item = _outputs(result, [n for n in outputs if any(o.name == n for o in response.outputs)])
            collected.append({"final": final, "outputs": item, **({"id": response.id} if with_ids else {})})
        return collected
    finally:
        client.stop_stream()
        client.close()


# Triton 2.51's Python backend aborts with this when a lock on the shared memory it shares with its
# stub is held past the timeout compiled into it, which a machine loaded far past its cores causes
# now and then whatever the request. That is the oracle failing, not an answer to compare.
ORACLE_LOAD_FAULT = "boost::interprocess::lock_exception"


def ask_triton(pair: Pair, call: Callable[..., T], *args: object, **kwargs: object) -> T:
    """`call(pair.triton, ...)`. Should Triton abort on ORACLE_LOAD_FAULT meanwhile, it is started
    again and asked once more (pystub is never asked twice); should that fail the same way, or
    Triton not start again, OracleUnavailable makes the case the oracle's (oracle_faults.py).
    The same holds for a call that returned while Triton aborted (an answer it collected as an
    error). Any other failure is the request's, as it always was."""
    for attempt in ("first", "second"):
        try:
            answer = call(pair.triton, *args, **kwargs)
        except Exception:
            death = _load_fault_death(pair)
            if death is None:
                raise
        else:
            # A call that collects errors as answers ("Stream removed (Socket closed)") returns
            # when the abort closes the socket under it: that answer is the dying oracle's too.
            death = _load_fault_death(pair)
            if death is None:
                return answer
        print(f"the oracle aborted on its own lock timeout at the {attempt} try (restarted):\n{death}")
        restart_oracle(pair, death)  # the second time: so that the next case finds an oracle
    raise OracleUnavailable(f"it aborted on its own lock timeout ({ORACLE_LOAD_FAULT}) twice in a row, "
                            f"restarted in between; the second time:\n{death}")


def _load_fault_death(pair: Pair) -> str | None:
    """Triton's exit status and last log lines when it died of ORACLE_LOAD_FAULT, else None."""
    # The fault is logged before the abort closes Triton's sockets, so before the call failed.
    if ORACLE_LOAD_FAULT not in pair.triton_server.log_tail():
        return None
    return pair.triton_server.died(within=30.0)  # the abort prints a stack trace, then exits


def restart_oracle(pair: Pair, why: str) -> None:
    """Start Triton again; OracleUnavailable when it will not start."""
    try:
        pair.triton_server.restart()
    except RuntimeError as error:
        raise OracleUnavailable(f"it died ({why.splitlines()[0]}) and did not start again: {error}") from None


def both(pair: Pair, call: Callable[..., T], *args: object, **kwargs: object) -> tuple[T, T]:
    """`call(endpoint, ...)` on Triton (ask_triton) and on pystub, in that order."""
    return ask_triton(pair, call, *args, **kwargs), call(pair.pystub, *args, **kwargs)


# Each server has its own copy of the repository (oracle.running_pair): paths into it are
# compared from the copy's root on ("At:" traceback tails of model errors name model.py).
_REPOSITORY_COPY = re.compile(r"/[^\s'\"]*/differential-[^/\s]+/(?:triton|pystub)/models/")


def _unrooted(value: object) -> object:
    if isinstance(value, str):
        return _REPOSITORY_COPY.sub("<repository>/", value)
    if isinstance(value, dict):
        return {key: _unrooted(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_unrooted(item) for item in value]
    return value


def agree(triton: object, pystub: object) -> None:
    """Assert that the two answers are equal (paths into each server's repository copy compared
    from the copy's root); the message shows both in full."""
    triton, pystub = _unrooted(triton), _unrooted(pystub)
    if triton != pystub:
        raise AssertionError(f"DIFF\n  triton: {json.dumps(triton, sort_keys=True, default=str)}\n"
                             f"  pystub: {json.dumps(pystub, sort_keys=True, default=str)}")
