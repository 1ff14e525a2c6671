"""The messages between the backend and a stub, one module per feature, and those of the frontend
workers' core link (workers); the catalogue lists them all.

Importing this package imports every message module, so that every process can decode every
kind; `catalogue.CATALOGUE` lists them all (number, name, direction, feature), and
`to_backend.ToBackend` is the union of the kinds a stub sends.
"""

from pystub_backend.ipc.messages import (
    bls,
    client_shm,
    core,
    forks,
    metrics,
    multiplex,
    sequences,
    to_backend,
    workers,
)
from pystub_backend.ipc.messages.catalogue import CATALOGUE, Direction, Entry, entry_of

__all__ = ["CATALOGUE", "Direction", "Entry", "entry_of", "bls", "client_shm", "core", "forks", "metrics", "multiplex",
           "sequences", "to_backend", "workers"]
