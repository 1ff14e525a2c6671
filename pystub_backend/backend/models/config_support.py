"""Which `ModelConfig` fields pystub acts on, and the one log line naming those it does not.

`FIELD_SUPPORT` is the table of every top-level field of Triton 2.51's `model_config.proto`
(and of the nested fields pystub only partly honours); `docs/model-config.md` is its long form.
At load, `unused_fields` lists the fields a model's config sets that pystub does not act on, and
`log_unused_fields` writes them on one line per model, so that a setting that silently does
nothing is visible. Defaults that normalization fills in (pinned memory in `optimization`, the
version policy, instance groups) are not the user's and are not reported.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from tritonclient.grpc import model_config_pb2

from pystub_backend.backend.config.model_config import ModelConfig

__all__ = ["FIELD_SUPPORT", "unused_fields", "log_unused_fields"]

log = logging.getLogger("pystub.model")

USED, PARTLY, IGNORED = "used", "partly", "ignored"

# field -> (support, what pystub does with it). Keep in step with docs/model-config.md.
FIELD_SUPPORT: dict[str, tuple[str, str]] = {
    "name": (USED, "must equal the directory name"),
    "platform": (USED, "`ensemble` runs an ensemble; shown in metadata"),
    "backend": (USED, "`python`, or a Python-based backend's model.py from --backend-directory"),
    "runtime": (IGNORED, "Triton's backend library / Python-based backend file; pystub derives it"),
    "version_policy": (USED, "latest / all / specific"),
    "max_batch_size": (USED, "validation, dynamic batching, warmup"),
    "input": (PARTLY, "validated; `reshape` and `format` are not acted on"),
    "output": (PARTLY, "validated; `reshape` and `label_filename` are not acted on"),
    "batch_input": (IGNORED, "not built (no ragged-batch helper tensors)"),
    "batch_output": (IGNORED, "not split"),
    "optimization": (IGNORED, "GPU / accelerator / priority settings; pinned-memory defaults are shown only"),
    "dynamic_batching": (USED, "the dynamic batcher"),
    "sequence_batching": (USED, "the sequence batcher"),
    "ensemble_scheduling": (USED, "ensembles"),
    "instance_group": (PARTLY, "count and kind (GPU runs as CPU); gpus, secondary_devices, profile, "
                                "passive, host_policy are not acted on"),
    "default_model_filename": (USED, "the file run in each version directory"),
    "cc_model_filenames": (IGNORED, "GPU compute capability files"),
    "metric_tags": (IGNORED, "not added to metrics"),
    "parameters": (USED, "passed to the model; pystub's own keys act (see README)"),
    "model_warmup": (USED, "run on every instance before the model is ready"),
    "model_operations": (IGNORED, "custom op libraries are not loaded"),
    "model_transaction_policy": (USED, "`decoupled`"),
    "model_repository_agents": (IGNORED, "repository agents are not run"),
    "response_cache": (IGNORED, "no response cache"),
    "model_metrics": (IGNORED, "newer than Triton 2.51; no custom metric settings"),
}


def _optimization_set(config: ModelConfig) -> bool:
    """Set beyond the pinned-memory defaults normalization fills in."""
    optimization = model_config_pb2.ModelOptimizationPolicy()
    optimization.CopyFrom(config.optimization)
    for name in ("input_pinned_memory", "output_pinned_memory"):
        if getattr(optimization, name).enable:
            optimization.ClearField(name)
    return optimization.ByteSize() > 0


def _nested(config: ModelConfig) -> list[str]:
    found = []
    for kind in ("input", "output"):
        for tensor in getattr(config, kind):
            if tensor.HasField("reshape"):
                found.append(f"{kind}.reshape")
            if kind == "input" and tensor.format:
                found.append("input.format")
            if kind == "output" and tensor.label_filename:
                found.append("output.label_filename")
    for group in config.instance_group:
        for name in ("gpus", "secondary_devices", "profile", "passive", "host_policy"):
            if getattr(group, name):
                found.append(f"instance_group.{name}")
    return list(dict.fromkeys(found))  # each once, in the order found


_SET: dict[str, Callable[[ModelConfig], bool]] = {"optimization": _optimization_set}


def unused_fields(config: ModelConfig) -> list[str]:
    """The fields `config` sets that pystub does not act on, top-level first, in proto order."""
    descriptor = config.DESCRIPTOR
    top = []
    for field in descriptor.fields:
        if FIELD_SUPPORT.get(field.name, (IGNORED, ""))[0] != IGNORED:
            continue
        is_set = _SET.get(field.name)
        if is_set is not None:
            present = is_set(config)
        elif field.message_type is not None and field.label != field.LABEL_REPEATED:
            present = config.HasField(field.name)
        else:
            present = bool(getattr(config, field.name))
        if present:
            top.append(field.name)
    return top + _nested(config)


def log_unused_fields(config: ModelConfig) -> None:
    """One WARNING line naming the config fields of the model that pystub does not act on (none: silent)."""
    fields = unused_fields(config)
    if fields:
        log.warning("model '%s': config fields pystub does not act on: %s", config.name, ", ".join(fields))
