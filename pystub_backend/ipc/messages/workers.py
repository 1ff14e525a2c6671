"""Messages of the frontend workers' core link (kinds 70-79): between a frontend worker process
and the core process, over a unix stream socket (not a stub channel). The framing that carries
them is `pystub_backend.backend.frontends.workers.link`.

    worker -> core                          core -> worker
    --------------                          --------------
    WorkerHello (worker, pid)               WorkerAnswer (id, LinkResponse)
    WorkerInfer (id, protocol, LinkRequest,  WorkerError (id, WireError)
                 LinkTrace | nil)
    WorkerCancel (id, task)

`id` is chosen by the worker, unique on its connection, and matches an answer or error to its
request. `protocol` is "HTTP" or "GRPC" (for the frontends' texts and the trace). WorkerCancel
with `task` true: the caller was cancelled (gRPC deadline or cancel), the core cancels the
request's task; false: the HTTP client left mid-request, the core closes its ClientLink.

Records (their array forms, in field order):

    LinkTensor   = [name, datatype, shape, data, parameters]   data: the tensor's bytes, inline
    LinkOutput   = [name, parameters]                            an output the client asked for
    LinkRequest  = [model, version, id, inputs: [LinkTensor], outputs: [LinkOutput], parameters]
    LinkResponse = [model, version, id, outputs: [LinkTensor], parameters]
    LinkTrace    = [traceparent | nil, received_start_ns, received_end_ns]

Parameters are what the frontends decoded, passed through unchanged: any int (past 64 bits too)
and any str (lone surrogates too) cross the link, so the core judges exactly what an in-process
frontend would have handed it.
"""

from __future__ import annotations

from typing import NamedTuple, Union

from pystub_backend.ipc.records import WireError
from pystub_backend.ipc.wire import message

__all__ = ["LinkTensor", "LinkOutput", "LinkRequest", "LinkResponse", "LinkTrace", "WorkerHello", "WorkerInfer",
           "WorkerCancel", "WorkerAnswer", "WorkerError", "LINK_MESSAGES"]

Parameters = dict[str, Union[bool, int, float, str]]


class LinkTensor(NamedTuple):
    name: str
    datatype: str
    shape: list[int]
    data: bytes | memoryview  # received as bytes; sent as a view of the tensor (no copy)
    parameters: Parameters


class LinkOutput(NamedTuple):
    name: str
    parameters: Parameters


class LinkRequest(NamedTuple):
    model: str
    version: str
    id: str
    inputs: list[LinkTensor]
    outputs: list[LinkOutput]
    parameters: Parameters


class LinkResponse(NamedTuple):
    model: str
    version: str
    id: str
    outputs: list[LinkTensor]
    parameters: Parameters


class LinkTrace(NamedTuple):
    """What the core needs to start a request's trace as the frontend would have."""

    traceparent: str | None
    received_start_ns: int
    received_end_ns: int


@message(70)
class WorkerHello(NamedTuple):
    worker: int  # the worker's index in the pool
    pid: int


@message(71)
class WorkerInfer(NamedTuple):
    id: int
    protocol: str
    request: LinkRequest
    trace: LinkTrace | None


@message(72)
class WorkerCancel(NamedTuple):
    id: int
    task: bool


@message(73)
class WorkerAnswer(NamedTuple):
    id: int
    response: LinkResponse


@message(74)
class WorkerError(NamedTuple):
    id: int
    error: WireError


LINK_MESSAGES: tuple[type, ...] = (WorkerHello, WorkerInfer, WorkerCancel, WorkerAnswer, WorkerError)
