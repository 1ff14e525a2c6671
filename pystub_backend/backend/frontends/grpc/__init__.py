"""The KServe v2 gRPC frontend: `create_grpc_listener` builds the server (h2 or grpc.aio).

    listener.py     the server: channel arguments, TLS, SO_REUSEPORT, services registered
    h2/             the h2 stack: pystub's gRPC server on libnghttp2 (the default; --grpc-server=aio is grpc.aio)
    servicer.py     inference.GRPCInferenceService;  stream.py  ModelStreamInfer
    codec.py        protobuf <-> inference records (ModelInfer skips protobuf for tensor bytes)
    health.py       grpc.health.v1.Health;  restrict.py  --grpc-restricted-protocol groups
    shm.py          shared memory extension;  protobuf_wire.py  the hand-written ModelInfer parser (bounded)
    offload.py      the parsing threads: large messages are inflated and parsed off the event loop
"""

from pystub_backend.backend.frontends.grpc.listener import GrpcListener, create_grpc_listener, create_grpc_server
from pystub_backend.backend.frontends.grpc.restrict import method_group

__all__ = ["GrpcListener", "create_grpc_listener", "create_grpc_server", "method_group"]
