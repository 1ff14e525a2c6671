"""pystub-backend: Triton Python-backend models served without Triton.

Three parts, each with its own public face: `backend` (the parent process, `pystub-backend`),
`stub` (one process per model instance), `ipc` (what both share) and `devices` (GPUs, behind
an interface both may use). See docs/architecture.md.

Importing the package first decides which of its hot modules run compiled (`_native_loader`,
docs/compiled.md): before any submodule is imported, so none is imported twice.
"""

from pystub_backend._native_loader import install as _install_native

_install_native()

__all__ = ["backend", "devices", "ipc", "stub"]
