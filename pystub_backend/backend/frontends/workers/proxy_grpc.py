"""The gRPC proxy of a frontend worker: every method the fast path does not serve goes, as bytes,
to the core's full gRPC server on its private unix socket (`unix:` channel).

One generic stream-stream handler carries every method (gRPC's wire has no arity: a unary call is
a stream of one message each way). Metadata goes through, with the client's address in
`access.INTERNAL_PEER` (a copy the client sent is dropped); the core's status, details, initial and
trailing metadata come back.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from pystub_backend.backend.frontends.access import INTERNAL_PEER

__all__ = ["GrpcProxy"]

# grpc.aio adds these itself; forwarding them would be refused or duplicated.
_OWN_METADATA = frozenset({INTERNAL_PEER, "user-agent", "grpc-accept-encoding", "grpc-encoding", "te",
                           "content-type", "grpc-timeout"})
# No BDP probing: the window of each stream from the core stays at HTTP/2's 64 KiB, so a stream
# whose client does not read holds at most that here (probing grew it to megabytes per stream).
_CHANNEL_OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1),
                    ("grpc.http2.bdp_probe", 0)]


class GrpcProxy(grpc.GenericRpcHandler):
    """A generic handler forwarding every method to the core at `unix:<path>`."""

    def __init__(self, path: str) -> None:
        self._channel = grpc.aio.insecure_channel(f"unix:{path}", options=_CHANNEL_OPTIONS)

    async def close(self) -> None:
        await self._channel.close()

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = details.method
        call = self._channel.stream_stream(method, request_serializer=None, response_deserializer=None)

        async def forward(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> None:
            # A coroutine writing with context.write, not a generator: grpc.aio cancels this task
            # when the client goes (a generator suspended at `yield` would not hear of it, and the
            # core's call would run on); and `write` waits for the client, so an unread stream
            # stops our reading of the core's (HTTP/2 flow control holds the rest in the core).
            metadata = [(key, value) for key, value in context.invocation_metadata() or ()
                        if key not in _OWN_METADATA]
            metadata.append((INTERNAL_PEER, context.peer() or ""))
            remaining = context.time_remaining()
            upstream = call(requests, metadata=metadata, timeout=remaining)
            try:
                initial = await upstream.initial_metadata()
                if initial:
                    await context.send_initial_metadata(tuple(initial))
                async for message in upstream:
                    await context.write(message)
            except grpc.aio.AioRpcError:
                pass  # the status is relayed below
            except BaseException:  # cancelled, or the client's side failed: the core's call ends too
                upstream.cancel()
                raise
            code = await upstream.code()
            context.set_trailing_metadata(tuple(await upstream.trailing_metadata() or ()))
            if code != grpc.StatusCode.OK:
                context.set_code(code)
                context.set_details(await upstream.details() or "")

        return grpc.stream_stream_rpc_method_handler(forward)
