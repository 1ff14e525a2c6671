"""Runs one call's method handler (a `grpc.RpcMethodHandler`, as the generated
`add_*Servicer_to_server` registers it) and ends the call with its status, as grpc.aio does:

- unary or streaming requests, deserialized with the handler's `request_deserializer`;
- a unary response returned, or responses yielded by an async generator or written with
  `context.write` by a coroutine, serialized with `response_serializer`;
- `context.abort` (AbortError), `set_code`/`set_details`, or an unexpected exception (UNKNOWN,
  logged) for the status; the deadline passing cancels the handler and ends DEADLINE_EXCEEDED;
  a client that resets the stream cancels the handler's task and gets nothing more.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from grpc.aio import AbortError

from pystub_backend.backend.frontends.grpc.h2.call import DEADLINE_DETAILS, ServerCall
from pystub_backend.backend.frontends.grpc.h2.context import H2ServicerContext
from pystub_backend.backend.frontends.grpc.h2.wire import WireError

__all__ = ["serve_call", "Lookup", "NOT_FOUND_DETAILS"]

log = logging.getLogger("pystub.grpc")
NOT_FOUND_DETAILS = "Method not found!"
# The method's handler for a call, interceptors applied (None: no such method).
Lookup = Callable[[str, H2ServicerContext], Awaitable[grpc.RpcMethodHandler | None]]


async def serve_call(call: ServerCall, lookup: Lookup) -> None:
    """The whole of one call, from its handler's lookup to its status."""
    context = H2ServicerContext(call)
    try:
        handler = await lookup(call.method, context)
        if handler is None:
            call.finish(grpc.StatusCode.UNIMPLEMENTED, NOT_FOUND_DETAILS)
            return
        await _run(handler, call, context)
        call.finish(context.code() or grpc.StatusCode.OK, context.details(), context.trailing_metadata())
    except AbortError:
        call.finish(context.code() or grpc.StatusCode.UNKNOWN, context.details(), context.trailing_metadata())
    except WireError as error:
        call.finish(error.code, error.details)
    except asyncio.CancelledError:
        if call.expired:
            call.finish(grpc.StatusCode.DEADLINE_EXCEEDED, DEADLINE_DETAILS)
        elif not call.cancelled:
            call.finish(grpc.StatusCode.CANCELLED, "the server is stopping")
    except Exception as exc:
        log.exception("gRPC %s: unexpected error in the method handler", call.method)
        call.finish(grpc.StatusCode.UNKNOWN, _unexpected(exc))
    finally:
        context.run_done_callbacks()


async def _run(handler: grpc.RpcMethodHandler, call: ServerCall, context: H2ServicerContext) -> None:
    deserialize, serialize = handler.request_deserializer, handler.response_serializer
    context.bind(serialize, deserialize)
    if handler.request_streaming:
        call.requests.streaming()
        request: Any = _requests(call, deserialize)
    else:
        request = _deserialized(await call.single_request(), deserialize)
    behaviour = handler.unary_unary or handler.stream_unary
    if behaviour is not None:
        response = await _resolved(behaviour(request, context))
        if response is not None and context.code() in (None, grpc.StatusCode.OK):
            call.send_unary(response if serialize is None else serialize(response))
        return
    behaviour = handler.unary_stream or handler.stream_stream
    result = behaviour(request, context)
    if inspect.isasyncgen(result):
        async for response in result:
            await context.write(response)
    elif inspect.isawaitable(result):
        await result
    elif result is not None:  # a synchronous generator (a grpcio sync servicer)
        for response in result:
            await context.write(response)


def _unexpected(exc: Exception) -> str:
    """grpc.aio's details for an exception that escaped the handler."""
    return f"Unexpected {type(exc)}: {exc}"


async def _resolved(result: Any) -> Any:
    return await result if inspect.isawaitable(result) else result


def _deserialized(payload: bytes, deserialize: Callable[[bytes], Any] | None) -> Any:
    if deserialize is None:
        return payload
    try:
        return deserialize(payload)
    except Exception as exc:  # grpc.aio's answer to a message that does not parse (not logged: the client's fault)
        raise WireError(grpc.StatusCode.UNKNOWN, _unexpected(exc)) from exc


async def _requests(call: ServerCall, deserialize: Callable[[bytes], Any] | None) -> AsyncIterator[Any]:
    while (payload := await call.next_request()) is not None:
        yield _deserialized(payload, deserialize)
