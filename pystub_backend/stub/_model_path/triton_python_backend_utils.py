"""`import triton_python_backend_utils as pb_utils` in a model resolves here.

The stub appends this directory to `sys.path` (docs/reference/model-api.md#files-imports-and-processes). Everything
is re-exported from `pystub_backend.stub.pb_utils`, so models and the stub share the very same classes.
"""

from pystub_backend.stub.pb_utils import *  # noqa: F401,F403
from pystub_backend.stub.pb_utils import __all__  # noqa: F401
