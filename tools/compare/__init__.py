"""Helpers of tools/bench_compare.py: pystub side by side with Triton 2.51 and MLServer 1.7.1.

Measured for each server, at each concurrency (default 1, 8, 32) and tensor size (default 16 B,
1 MiB, 16 MiB), over gRPC and HTTP (binary tensors; JSON for MLServer, which has no binary
extension): throughput and p50/p99 latency, medians over rounds, and pystub's ratio to each peer.

    environment  the peers' own venv (.bench/venv): MLServer, Triton 2.51 from nvidia-pytriton,
                 perf_analyzer from tritonclient 2.50.0
    servers      start/stop pystub, tritonserver and mlserver on loopback with the same models
    loadgen      the asyncio load generator (tritonclient aio clients), client shared memory
    perf_analyzer  the C++ load generator, where it runs (pystub, Triton)
    probe        health/metadata latency while inference saturates the server
    streaming    a decoupled model's streamed 16 B responses over gRPC streams and SSE (responses/s,
                 CPU per response of the server, its stubs and the load generator)
    wrk_h2load   the C load generators (wrk for HTTP, h2load for gRPC), each window checked against
                 the server's statistics; environment installs them with apt-get when missing
    pipelines    the BLS, ensemble and dynamic-batching models and cells (perf_analyzer, gRPC)
    revision     --pystub-rev: another revision's tree exported for pystub-base
    runner       rounds and interleaving;  report / targets: the table and the issue's targets
    path_report  the request path's markdown tables: the floor (tools/floor), Triton, pystub
"""
