"""The parent process, `pystub-backend`: frontends, models, schedulers, stub supervision.

How a request travels:

    client ──HTTP/gRPC──▶ frontends/http.py, frontends/grpc.py      decode into inference.InferRequest
                            │                                        (tensor data = views of the message)
                            ▼
                          core.Core.infer ── validation.validate_request
                            │
                            ▼
                          model_version.ModelVersion ── scheduling.make_scheduler picks one of:
                            │     scheduler.DefaultScheduler (next free instance)
                            │     dynamic_batcher.DynamicBatcher (gathers batches)
                            │     sequence_batcher.SequenceBatcher (correlation ids, slots, eviction)
                            │     multiplex_router (routes to the instance holding the sub-model)
                            │   (ensemble.py runs `platform: "ensemble"` steps through the core)
                            ▼
                          model_instance.ModelInstance (supervision: restart, health) ──▶
                          stub_process.StubProcess.execute_streams   inputs → p2s arena (one copy), EXECUTE
    ═══════════════════ process boundary: ipc/ arenas + SEQPACKET channel ═══════════════════
                          pystub_backend/stub/stub.py: views of the arena → TritonPythonModel.execute → s2p arena
                          (BLS: pystub_backend/stub/features/bls.py → BLS frames → pystub_backend/backend/features/bls/handlers.py → core.infer_stream → …)
    ═════════════════════════════════════════════════════════════════════════════════════════
                          RESPONSE / EXECUTE_DONE frames → response_stream.ResponseStream of
                          inference.InferResponse (views of s2p; credits bound what is buffered)
                            │
                            ▼
                          frontend encodes (one copy out), then InferResponse.release() → RELEASE frame

Public entry points: `pystub_backend.backend.cli.main` (the `pystub-backend` command) and `pystub_backend.backend.stubctl.main`.
"""

__all__ = ["cli", "core", "stubctl"]
