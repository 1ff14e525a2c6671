"""`ModelConfig`: the config a model completes in `auto_complete_config` (docs/reference/model-api.md#modelconfig).

The rules and their texts are the original's, including its quirks (for instance a property
check that reads `input["name"]` before checking that the name exists, so a dict with an unknown
property and no name raises KeyError).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["ModelConfig"]

_REQUIRED_KEYS = ("name", "max_batch_size", "input", "output")


class ModelConfig:
    """`ModelConfig(json_str)` (a dict is accepted too); the dict lives in `_model_config`.

    Raises ValueError when the config is not a JSON object or misses one of `name`,
    `max_batch_size`, `input`, `output`.
    """

    def __init__(self, model_config: str | bytes | dict[str, Any]) -> None:
        config = model_config if isinstance(model_config, dict) else json.loads(model_config)
        if not isinstance(config, dict):
            raise ValueError(f"model configuration must be a JSON object, got {type(config)}")
        missing = [key for key in _REQUIRED_KEYS if key not in config]
        if missing:
            raise ValueError(f"model configuration is missing {', '.join(repr(k) for k in missing)}")
        self._model_config: dict[str, Any] = config

    def as_dict(self) -> dict[str, Any]:
        """The live configuration dict."""
        return self._model_config

    def _name(self) -> str:
        return str(self._model_config["name"])

    def set_max_batch_size(self, max_batch_size: int) -> None:
        """Raises ValueError if the config already specifies a larger max_batch_size."""
        current = self._model_config["max_batch_size"]
        if current > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {current}, but in auto-complete-config "
                f"function for model '{self._name()}' specified max_batch_size {max_batch_size}"
            )
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        """Add `dynamic_batching: {}` unless present. Raises ValueError if another scheduler is set."""
        found = None
        if "sequence_batching" in self._model_config:
            found = "sequence_batching"
        elif "ensemble_scheduling" in self._model_config:
            found = "ensemble_scheduling"
        if found is not None:
            raise ValueError(
                f"Configuration specified scheduling_choice as '{found}', but auto-complete-config "
                f"function for model '{self._name()}' tries to set scheduling_choice as 'dynamic_batching'"
            )
        self._model_config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict[str, Any]) -> None:  # noqa: A002 - the original's name
        """Add or update an input. Raises ValueError for unknown or missing properties and for a
        conflict with an existing input of the same name."""
        self._check_properties("input", input, ("name", "data_type", "dims", "optional"),
                               "'name', 'data_type', 'dims' and 'optional'")
        existing = _find(self._model_config["input"], input["name"])
        if existing is None:
            self._model_config["input"].append(input)
            return
        self._check_compatible("input", existing, input)
        if "optional" in existing and "optional" in input and existing["optional"] != input["optional"]:
            raise ValueError(
                f"model '{self._name()}', tensor '{input['name']}': the model expects optional "
                f"{input['optional']} but the model configuration specifies optional {existing['optional']}"
            )
        existing["data_type"] = input["data_type"]
        existing["dims"] = input["dims"]
        if "optional" in input:
            existing["optional"] = input["optional"]

    def add_output(self, output: dict[str, Any]) -> None:
        """Add or update an output; raises ValueError like `add_input`."""
        self._check_properties("output", output, ("name", "data_type", "dims"), "'name', 'data_type' and 'dims'")
        existing = _find(self._model_config["output"], output["name"])
        if existing is None:
            self._model_config["output"].append(output)
            return
        self._check_compatible("output", existing, output)
        existing["data_type"] = output["data_type"]
        existing["dims"] = output["dims"]

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        """Set `decoupled`. Raises ValueError for another property or for changing a value set
        by the configuration."""
        for key in transaction_policy_dict.keys():  # noqa: SIM118 - a None argument fails here, as in the original
            if key != "decoupled":
                raise ValueError(
                    "model transaction property in auto-complete-config function for model "
                    f"'{self._name()}' contains property other than 'decoupled'."
                )
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            decoupled = transaction_policy_dict["decoupled"]
            if "decoupled" in policy and policy["decoupled"] != decoupled:
                raise ValueError(
                    "trying to change decoupled property in auto-complete-config for model "
                    f"'{self._name()}', which is already set to '{policy['decoupled']}'."
                )
            policy["decoupled"] = decoupled

    def _check_properties(self, kind: str, tensor: dict[str, Any], valid: tuple[str, ...], listed: str) -> None:
        for key in tensor:
            if key not in valid:
                raise ValueError(
                    f"{kind} '{tensor['name']}' in auto-complete-config function for model "
                    f"'{self._name()}' contains property other than {listed}."
                )
        if "name" not in tensor:
            raise ValueError(
                f"{kind} in auto-complete-config function for model '{self._name()}' is missing 'name' property."
            )
        for key in ("data_type", "dims"):
            if key not in tensor:
                raise ValueError(
                    f"{kind} '{tensor['name']}' in auto-complete-config function for model "
                    f"'{self._name()}' is missing '{key}' property."
                )

    def _check_compatible(self, kind: str, existing: dict[str, Any], tensor: dict[str, Any]) -> None:
        current_type = existing.get("data_type", "TYPE_INVALID")
        if current_type != "TYPE_INVALID" and current_type != tensor["data_type"]:
            raise ValueError(
                f"unable to load model '{self._name()}', configuration expects datatype {current_type} "
                f"for {kind} '{tensor['name']}', model provides {tensor['data_type']}"
            )
        current_dims = existing.get("dims")
        if current_dims and current_dims != tensor["dims"]:
            raise ValueError(
                f"model '{self._name()}', tensor '{tensor['name']}': the model expects dims "
                f"{tensor['dims']} but the model configuration specifies dims {current_dims}"
            )


def _find(entries: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    for entry in entries:
        if entry.get("name") == name:
            return entry
    return None
