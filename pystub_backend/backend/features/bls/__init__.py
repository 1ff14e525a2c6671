"""BLS and model control from the stubs: the payload registry, the calls, the deadlock check and
the frame handlers (`handlers.register`)."""

from pystub_backend.backend.features.bls.payloads import REGISTRY, PayloadRegistry

__all__ = ["PayloadRegistry", "REGISTRY"]
