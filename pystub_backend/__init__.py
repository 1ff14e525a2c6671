"""pystub-backend: Triton Python-backend models served without Triton.

Three parts, each with its own public face: `backend` (the parent process, `pystub-backend`),
`stub` (one process per model instance), `ipc` (what both share) and `devices` (GPUs, behind
an interface both may use). See docs/architecture.md.
"""

__all__ = ["backend", "devices", "ipc", "stub"]
