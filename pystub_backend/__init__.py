"""pystub-backend: Triton Python-backend models served without Triton.

Three parts, each with its own public face: `backend` (the parent process, `pystub-backend`),
`stub` (one process per model instance) and `ipc` (what both share). See docs/architecture.md.
"""

__all__ = ["backend", "ipc", "stub"]
