"""The stub side: runs one model instance in its own process.

`python -m pystub_backend.stub.triton_python_backend_stub` starts `stub.Stub`; `pb_utils` is the model-side
API that `import triton_python_backend_utils as pb_utils` resolves to (via `_model_path/`).
"""

from pystub_backend.stub import pb_utils

__all__ = ["pb_utils"]
