"""gRPC messages of the shared memory extensions (docs/reference/protocol.md#grpc-service,
#system-shared-memory-extension), answered from the core's
`ClientShmRegions`. The servicer's methods call these; errors are
`ServerError`s, which the servicer turns into gRPC statuses.

    SystemSharedMemoryStatus{name}     -> {regions: map<name, {name, key, offset, byte_size}>}
    SystemSharedMemoryRegister{name, key, offset, byte_size}
    SystemSharedMemoryUnregister{name}    ("" means all)
    CudaSharedMemoryStatus{name}       -> {regions: map<name, {name, device_id, byte_size}>}
    CudaSharedMemoryRegister{name, raw_handle, device_id, byte_size}   (refused without a GPU)
    CudaSharedMemoryUnregister{name}      ("" means all)
"""

from __future__ import annotations

from tritonclient.grpc import service_pb2 as pb

from pystub_backend.backend.inference import ClientShmRegions

__all__ = ["system_status", "system_register", "system_unregister", "cuda_status", "cuda_register",
           "cuda_unregister"]


def system_status(registry: ClientShmRegions,
                  request: pb.SystemSharedMemoryStatusRequest) -> pb.SystemSharedMemoryStatusResponse:
    response = pb.SystemSharedMemoryStatusResponse()
    for region in registry.status(request.name):
        entry = response.regions[region["name"]]
        entry.name, entry.key = region["name"], region["key"]
        entry.offset, entry.byte_size = region["offset"], region["byte_size"]
    return response


def system_register(registry: ClientShmRegions,
                    request: pb.SystemSharedMemoryRegisterRequest) -> pb.SystemSharedMemoryRegisterResponse:
    registry.register(request.name, request.key, request.offset, request.byte_size)
    return pb.SystemSharedMemoryRegisterResponse()


def system_unregister(registry: ClientShmRegions,
                      request: pb.SystemSharedMemoryUnregisterRequest) -> pb.SystemSharedMemoryUnregisterResponse:
    registry.unregister(request.name)
    return pb.SystemSharedMemoryUnregisterResponse()


def cuda_status(registry: ClientShmRegions,
                request: pb.CudaSharedMemoryStatusRequest) -> pb.CudaSharedMemoryStatusResponse:
    response = pb.CudaSharedMemoryStatusResponse()
    for region in registry.cuda_status(request.name):
        entry = response.regions[region["name"]]
        entry.name, entry.device_id, entry.byte_size = region["name"], region["device_id"], region["byte_size"]
    return response


def cuda_register(registry: ClientShmRegions,
                  request: pb.CudaSharedMemoryRegisterRequest) -> pb.CudaSharedMemoryRegisterResponse:
    registry.cuda_register(request.name, bytes(request.raw_handle), request.device_id, request.byte_size)
    return pb.CudaSharedMemoryRegisterResponse()


async def cuda_unregister(registry: ClientShmRegions,
                          request: pb.CudaSharedMemoryUnregisterRequest) -> pb.CudaSharedMemoryUnregisterResponse:
    await registry.cuda_unregister_closed(request.name)  # the stubs closed their handles
    return pb.CudaSharedMemoryUnregisterResponse()
