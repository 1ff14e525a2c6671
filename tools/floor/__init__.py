"""The request path's floor: pystub's design reduced to what one small inference needs, in pure Python.

Two processes, as pystub's backend and its stub:

    client --HTTP/1.1 or gRPC--> parent (asyncio) --msgpack on SOCK_SEQPACKET--> model process
                                     httptools + orjson                            Request -> execute
                                     ngh2 + protobuf                               -> Response
    client <--v2 binary response-- parent <--msgpack on SOCK_SEQPACKET------------ model process

    serve.py          the parent: starts the model process, serves HTTP and gRPC on one event loop
    http_front.py     HTTP/1.1 (httptools), the KServe v2 JSON header (orjson), binary tensors
    grpc_front.py     gRPC on HTTP/2 (ngh2, the library pystub's h2 stack is built on), ModelInfer
    model_link.py     the parent's end of the socketpair: one datagram out per request, answers by id
    model_process.py  the model process: a request object with numpy views, an identity `execute`

It serves identity_fp32 (INPUT0 -> OUTPUT0, any numeric datatype and shape, tensors of up to
64 KiB) and what perf_analyzer and the bench harness ask first (metadata, config, readiness,
statistics), and nothing else: no scheduler, no statistics beyond two counters, no tracing, no
deadlines, no supervision beyond "the model process exited". pystub will not reach it; its CPU
per request says what the design costs in Python before any feature, beside Triton's C++.

    python tools/floor/serve.py HTTP_PORT GRPC_PORT
"""
