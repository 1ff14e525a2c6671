"""gRPC messages of the shared memory extensions (PROTOCOL.md sections 4 and 11), answered from the
core's `pystub_backend.backend.features.client_shm.ClientShmRegistry`. The servicer's methods call these; errors are
`ServerError`s, which the servicer turns into gRPC statuses.

    SystemSharedMemoryStatus{name}     -> {regions: map<name, {name, key, offset, byte_size}>}
    SystemSharedMemoryRegister{name, key, offset, byte_size}
    SystemSharedMemoryUnregister{name}    ("" means all)
    CudaSharedMemoryStatus{name}       -> {regions: {}} (CPU only)
    CudaSharedMemoryRegister{...}      -> refused
    CudaSharedMemoryUnregister{name}   -> ok
"""

from __future__ import annotations

from typing import Any

from tritonclient.grpc import service_pb2

__all__ = ["system_status", "system_register", "system_unregister", "cuda_status", "cuda_register",
           "cuda_unregister"]


def system_status(registry: Any, request: Any) -> service_pb2.SystemSharedMemoryStatusResponse:
    response = service_pb2.SystemSharedMemoryStatusResponse()
    for region in registry.status(request.name):
        entry = response.regions[region["name"]]
        entry.name, entry.key = region["name"], region["key"]
        entry.offset, entry.byte_size = region["offset"], region["byte_size"]
    return response


def system_register(registry: Any, request: Any) -> service_pb2.SystemSharedMemoryRegisterResponse:
    registry.register(request.name, request.key, request.offset, request.byte_size)
    return service_pb2.SystemSharedMemoryRegisterResponse()


def system_unregister(registry: Any, request: Any) -> service_pb2.SystemSharedMemoryUnregisterResponse:
    registry.unregister(request.name)
    return service_pb2.SystemSharedMemoryUnregisterResponse()


def cuda_status(registry: Any, request: Any) -> service_pb2.CudaSharedMemoryStatusResponse:
    registry.cuda_status(request.name)  # raises for a named region: none exists
    return service_pb2.CudaSharedMemoryStatusResponse()


def cuda_register(registry: Any, request: Any) -> service_pb2.CudaSharedMemoryRegisterResponse:
    registry.cuda_register(request.name)
    return service_pb2.CudaSharedMemoryRegisterResponse()


def cuda_unregister(registry: Any, request: Any) -> service_pb2.CudaSharedMemoryUnregisterResponse:
    registry.cuda_unregister(request.name)
    return service_pb2.CudaSharedMemoryUnregisterResponse()
