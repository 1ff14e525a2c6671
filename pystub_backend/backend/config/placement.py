"""Where a model's instances run, as Triton places them: kinds, devices and instance names.

    instance_group { kind: KIND_GPU count: 2 gpus: [0, 1] }   (name "m_0")
        -> m_0_0 on GPU 0, m_0_0 on GPU 1, m_0_1 on GPU 0, m_0_1 on GPU 1

`count` instances per listed device, the count outside and the devices inside, and the same
name on each device (Triton's backend_model_instance.cc). Normalization fills what the config
leaves open: KIND_AUTO is KIND_GPU on every visible GPU when there is one, else KIND_CPU;
KIND_GPU without `gpus` lists every visible GPU. A KIND_GPU group that no GPU can serve fails the
load with Triton's text (model_config_utils.cc).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tritonclient.grpc import model_config_pb2
from tritonclient.grpc.model_config_pb2 import ModelConfig

__all__ = ["Placement", "PlacementError", "place_groups", "check_placement", "placements"]

_Group = model_config_pb2.ModelInstanceGroup
_KIND_NAMES = {_Group.KIND_CPU: "CPU", _Group.KIND_GPU: "GPU", _Group.KIND_MODEL: "MODEL"}
# Triton's --min-supported-compute-capability default, as its message prints it.
_MIN_COMPUTE_CAPABILITY = "6.000000"


class PlacementError(ValueError):
    """A group the visible GPUs cannot serve; the message is Triton's text (an invalid argument)."""


@dataclass(frozen=True)
class Placement:
    """One instance: its group, its (Triton) name, its kind (CPU/GPU/MODEL) and device id."""

    group: str
    name: str
    kind: str
    device_id: int


def place_groups(config: ModelConfig, gpus: Sequence[int]) -> None:
    """Resolve KIND_AUTO and fill the `gpus` of KIND_GPU groups from the visible GPUs, in place."""
    for group in config.instance_group:
        if group.kind == _Group.KIND_AUTO:
            group.kind = _Group.KIND_GPU if group.gpus or gpus else _Group.KIND_CPU
        if group.kind == _Group.KIND_GPU and not group.gpus:
            group.gpus.extend(gpus)


def check_placement(config: ModelConfig, gpus: Sequence[int]) -> None:
    """Raise PlacementError with Triton's text for a KIND_GPU group without a usable GPU."""
    for group in config.instance_group:
        if group.kind != _Group.KIND_GPU:
            continue
        where = f"instance group {group.name} of model {config.name}"
        if not group.gpus:
            raise PlacementError(f"{where} has kind KIND_GPU but no GPUs are available" if not gpus
                                 else f"{where} has kind KIND_GPU but specifies no GPUs")
        for device in group.gpus:
            if device not in gpus:
                listed = ", ".join(str(gpu) for gpu in gpus)
                raise PlacementError(f"{where} specifies invalid or unsupported gpu id {device}. GPUs with at "
                                     f"least the minimum required CUDA compute compatibility of "
                                     f"{_MIN_COMPUTE_CAPABILITY} are: {listed}")


def placements(config: ModelConfig) -> list[Placement]:
    """Every instance of a normalized config, in Triton's creation order."""
    found: list[Placement] = []
    for index, group in enumerate(config.instance_group):
        group_name = group.name or f"{config.name}_{index}"
        kind = _KIND_NAMES.get(group.kind, "CPU")
        devices = list(group.gpus) if group.kind == _Group.KIND_GPU else [0]
        for number in range(max(group.count, 1)):
            found.extend(Placement(group_name, f"{group_name}_{number}", kind, device) for device in devices)
    return found
