"""What the device check's models do on the GPU, in PyTorch or, for `gpu_check.py --fake`, on
pystub's fake device (pystub_backend.devices.fake): the same model code runs on both.

None of it synchronizes: a model hands pystub tensors whose kernels may still be queued, as models
under Triton do, so the check proves that pystub waits where it must. On PyTorch a "long kernel"
is `torch.cuda._sleep` (a spin of the GPU's clock), so the work after it is still queued when the
model returns; on the fake device nothing lands before a synchronization anyway.

    kit = load()                     GPU_CHECK_KIT=fake or torch (default)
    x = kit.on_device(tensor, d)     a pb_utils input (CPU or GPU) as a device tensor on d
    kit.long_kernel(d)               queue ~50 ms of GPU work on the current stream
    y = kit.affine(x)                y = x * 2 + 1, queued (kit.copy(x): y = x)
    with kit.side_stream(d): ...     a new non-blocking stream, current inside
    kit.output(name, y, as_object)   pb_utils.Tensor.from_dlpack of a capsule, or of the object itself
    kit.empty(d), kit.hold(nbytes, d), kit.device_count(), kit.current_device()
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

__all__ = ["load"]

_SPIN_CYCLES = 100_000_000  # about 50 ms at 2 GHz


class _Torch:
    def __init__(self) -> None:
        import torch

        self.torch = torch

    def on_device(self, tensor: Any, device: int) -> Any:  # noqa: ANN401
        return self.torch.from_dlpack(tensor.to_dlpack()).to(self.torch.device("cuda", device))

    def long_kernel(self, device: int) -> None:
        with self.torch.cuda.device(device):
            self.torch.cuda._sleep(_SPIN_CYCLES)

    def affine(self, x: Any) -> Any:  # noqa: ANN401
        return (x * 2 + 1).contiguous()

    def copy(self, x: Any) -> Any:  # noqa: ANN401
        return x.clone()

    @contextlib.contextmanager
    def side_stream(self, device: int) -> Iterator[None]:
        with self.torch.cuda.stream(self.torch.cuda.Stream(device)):
            yield

    def output(self, name: str, y: Any, as_object: bool = False) -> Any:  # noqa: ANN401
        import triton_python_backend_utils as pb_utils

        return pb_utils.Tensor.from_dlpack(name, y if as_object else self.torch.utils.dlpack.to_dlpack(y))

    def empty(self, device: int) -> Any:  # noqa: ANN401
        return self.torch.empty(0, dtype=self.torch.float32, device=self.torch.device("cuda", device))

    def hold(self, nbytes: int, device: int | None = None) -> Any:  # noqa: ANN401 - None: "cuda"
        where = self.torch.device("cuda") if device is None else self.torch.device("cuda", device)
        return self.torch.ones(nbytes, dtype=self.torch.uint8, device=where)

    def device_count(self) -> int:
        return int(self.torch.cuda.device_count())

    def device_of(self, y: Any) -> int:  # noqa: ANN401
        return int(y.device.index)


class _FakeTensor:
    """A fake device array, with what keeps the memory it views alive."""

    def __init__(self, array: Any, device: int, keep: object = None) -> None:  # noqa: ANN401
        self.array, self.device, self.keep = array, device, keep


class _Fake:
    def __init__(self) -> None:
        from pystub_backend.devices import fake

        self.fake = fake
        # expandable segments (set before PyTorch allocates) make memory CUDA IPC cannot export
        self.exportable = "expandable_segments:True" not in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")

    def _array(self, values: Any, device: int) -> Any:  # noqa: ANN401
        return self.fake.fake_device_array(values, device, self.exportable)

    def on_device(self, tensor: Any, device: int) -> _FakeTensor:  # noqa: ANN401
        if tensor.is_cpu():
            return _FakeTensor(self._array(tensor.as_numpy(), device), device)
        capsule = tensor.to_dlpack()
        return _FakeTensor(self.fake.fake_array_of(capsule), tensor.__dlpack_device__()[1], (tensor, capsule))

    def long_kernel(self, device: int) -> None:
        self.fake.fake_kernel(device, lambda: None)

    def affine(self, x: _FakeTensor) -> _FakeTensor:
        return self._kernel(x, lambda source: source * 2 + 1)

    def copy(self, x: _FakeTensor) -> _FakeTensor:
        return self._kernel(x, lambda source: source)

    def _kernel(self, x: _FakeTensor, compute: Any) -> _FakeTensor:  # noqa: ANN401
        import numpy as np

        out = self._array(np.zeros(x.array.shape, x.array.dtype), x.device)
        source = x.array

        def run() -> None:  # reads its input when it lands, as a kernel does
            out[...] = compute(source)
        self.fake.fake_kernel(x.device, run, (out, source))
        return _FakeTensor(out, x.device, x)

    @contextlib.contextmanager
    def side_stream(self, device: int) -> Iterator[None]:
        with self.fake.fake_side_stream(device):
            yield

    def output(self, name: str, y: _FakeTensor, as_object: bool = False) -> Any:  # noqa: ANN401
        import triton_python_backend_utils as pb_utils

        # The capsule's owner keeps the array (and so its allocation) alive; a queued kernel holds
        # what it reads and writes until it lands.
        producer = self.fake.FakeCudaTensor(y.array, y.device)
        return pb_utils.Tensor.from_dlpack(name, producer if as_object else self.fake.fake_cuda_capsule(y.array,
                                                                                                       y.device))

    def empty(self, device: int) -> _FakeTensor:
        import numpy as np

        return _FakeTensor(self._array(np.empty(0, np.float32), device), device)

    def hold(self, nbytes: int, device: int | None = None) -> _FakeTensor:
        import numpy as np

        where = 0 if device is None else device  # "cuda": ordinal 0, as at start
        return _FakeTensor(self._array(np.ones(nbytes, np.uint8), where), where)

    def device_count(self) -> int:
        from pystub_backend.devices import fake_engine

        return len(fake_engine.visible_devices())

    def device_of(self, y: _FakeTensor) -> int:
        return y.device


def load() -> Any:  # noqa: ANN401 - _Torch or _Fake, one face
    """The kit of this process: GPU_CHECK_KIT=fake for the fake device, else PyTorch."""
    return _Fake() if os.environ.get("GPU_CHECK_KIT") == "fake" else _Torch()
