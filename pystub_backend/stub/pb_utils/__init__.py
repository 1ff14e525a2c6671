"""The model-side API: everything `import triton_python_backend_utils as pb_utils` gives a model.

    model.py ──uses──▶ Tensor / InferenceRequest / InferenceResponse / InferenceResponseSender
                       Logger, MetricFamily, ModelConfig, load_model, BLS (request.exec)
                          │
                          ▼  pb_utils._runtime hooks, installed by the stub
                       log sink · BLS handler · model control · metric reporter

Names without a leading underscore below are the public API (docs/reference/model-api.md). The stub
uses the underscore constructors (`Tensor._from_array`, `InferenceRequest._from_server`, ...) and
`pb_utils._runtime`.
"""

from ._constants import (
    TRITONSERVER_MEMORY_CPU,
    TRITONSERVER_MEMORY_GPU,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_END,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
    TRITONSERVER_REQUEST_RELEASE_ALL,
    TRITONSERVER_REQUEST_RELEASE_RESCHEDULE,
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    MemoryType,
)
from ._errors import TritonError, TritonModelException
from ._helpers import (
    get_input_config_by_name,
    get_input_tensor_by_name,
    get_model_dir,
    get_output_config_by_name,
    get_output_tensor_by_name,
    using_decoupled_model_transaction_policy,
)
from ._iterator import ResponseIterator
from ._logger import Logger
from ._metrics import Metric, MetricFamily
from ._model_config import ModelConfig
from ._model_control import is_model_ready, load_model, unload_model
from ._multiplex import async_get_multiplexed_model, get_multiplexed_model, get_multiplexed_model_id
from ._output_arrays import new_output_array
from ._request import InferenceRequest
from ._request_options import InferenceTrace, PreferredMemory
from ._response import InferenceResponse
from ._sender import InferenceResponseSender
from ._tensor import Tensor
from ._types import (
    TRITON_STRING_TO_NUMPY,
    deserialize_bytes_tensor,
    numpy_to_triton_type,
    serialize_byte_tensor,
    triton_string_to_numpy,
    triton_to_numpy_type,
)

__all__ = [
    "TRITONSERVER_MEMORY_CPU",
    "TRITONSERVER_MEMORY_GPU",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "TRITON_STRING_TO_NUMPY",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "InferenceTrace",
    "Logger",
    "MemoryType",
    "Metric",
    "MetricFamily",
    "ModelConfig",
    "PreferredMemory",
    "ResponseIterator",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "async_get_multiplexed_model",
    "deserialize_bytes_tensor",
    "get_input_config_by_name",
    "get_input_tensor_by_name",
    "get_model_dir",
    "get_multiplexed_model",
    "get_multiplexed_model_id",
    "new_output_array",
    "get_output_config_by_name",
    "get_output_tensor_by_name",
    "is_model_ready",
    "load_model",
    "numpy_to_triton_type",
    "serialize_byte_tensor",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
    "unload_model",
    "using_decoupled_model_transaction_policy",
]
