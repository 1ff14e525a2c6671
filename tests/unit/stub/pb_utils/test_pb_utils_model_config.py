"""pb_utils.ModelConfig (auto-complete, docs/reference/model-api.md#modelconfig) and the config lookup helpers."""

from __future__ import annotations

import json

import pytest

from pystub_backend.stub import pb_utils
from pystub_backend.stub.pb_utils import ModelConfig


def _config(**extra):
    config = {
        "name": "add_sub",
        "max_batch_size": 0,
        "input": [{"name": "IN0", "data_type": "TYPE_FP32", "dims": [4], "optional": False}],
        "output": [{"name": "OUT0", "data_type": "TYPE_INVALID", "dims": []}],
    }
    config.update(extra)
    return ModelConfig(json.dumps(config))


def _raises(call, text):
    with pytest.raises(ValueError) as exc:
        call()
    assert str(exc.value) == text


def test_constructor_and_as_dict_is_live():
    config = _config()
    assert config.as_dict() is config._model_config
    config.as_dict()["max_batch_size"] = 3
    assert config._model_config["max_batch_size"] == 3
    assert ModelConfig({"name": "x", "max_batch_size": 0, "input": [], "output": []}).as_dict()["name"] == "x"


def test_constructor_requires_the_basic_keys():
    with pytest.raises(ValueError):
        ModelConfig(json.dumps({"name": "x", "input": [], "output": []}))
    with pytest.raises(ValueError):
        ModelConfig("[]")


def test_set_max_batch_size():
    config = _config(max_batch_size=4)
    config.set_max_batch_size(8)
    assert config.as_dict()["max_batch_size"] == 8
    config.set_max_batch_size(8)
    _raises(lambda: config.set_max_batch_size(2),
            "configuration specified max_batch_size 8, but in auto-complete-config function for model "
            "'add_sub' specified max_batch_size 2")


def test_set_dynamic_batching():
    config = _config()
    config.set_dynamic_batching()
    assert config.as_dict()["dynamic_batching"] == {}
    config.as_dict()["dynamic_batching"] = {"max_queue_delay_microseconds": 5}
    config.set_dynamic_batching()  # already set: left alone
    assert config.as_dict()["dynamic_batching"] == {"max_queue_delay_microseconds": 5}


@pytest.mark.parametrize("scheduler", ["sequence_batching", "ensemble_scheduling"])
def test_set_dynamic_batching_conflicts(scheduler):
    config = _config(**{scheduler: {}})
    _raises(config.set_dynamic_batching,
            f"Configuration specified scheduling_choice as '{scheduler}', but auto-complete-config function "
            "for model 'add_sub' tries to set scheduling_choice as 'dynamic_batching'")


def test_add_new_input_and_output():
    config = _config()
    config.add_input({"name": "IN1", "data_type": "TYPE_STRING", "dims": [-1], "optional": True})
    config.add_output({"name": "OUT1", "data_type": "TYPE_INT32", "dims": [1]})
    assert config.as_dict()["input"][-1] == {"name": "IN1", "data_type": "TYPE_STRING", "dims": [-1], "optional": True}
    assert config.as_dict()["output"][-1] == {"name": "OUT1", "data_type": "TYPE_INT32", "dims": [1]}
    assert pb_utils.get_input_config_by_name(config.as_dict(), "IN1")["data_type"] == "TYPE_STRING"
    assert pb_utils.get_output_config_by_name(config.as_dict(), "OUT1")["dims"] == [1]
    assert pb_utils.get_input_config_by_name(config.as_dict(), "missing") is None
    assert pb_utils.get_output_config_by_name({}, "OUT1") is None


def test_update_existing_entries():
    config = _config()
    config.add_input({"name": "IN0", "data_type": "TYPE_FP32", "dims": [4], "optional": False})
    config.add_output({"name": "OUT0", "data_type": "TYPE_FP16", "dims": [2, 2]})
    assert len(config.as_dict()["input"]) == 1
    assert config.as_dict()["output"] == [{"name": "OUT0", "data_type": "TYPE_FP16", "dims": [2, 2]}]


def test_input_properties():
    config = _config()
    _raises(lambda: config.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [1], "format": 1}),
            "input 'X' in auto-complete-config function for model 'add_sub' contains property other than "
            "'name', 'data_type', 'dims' and 'optional'.")
    _raises(lambda: config.add_input({"data_type": "TYPE_FP32", "dims": [1]}),
            "input in auto-complete-config function for model 'add_sub' is missing 'name' property.")
    _raises(lambda: config.add_input({"name": "X", "dims": [1]}),
            "input 'X' in auto-complete-config function for model 'add_sub' is missing 'data_type' property.")
    _raises(lambda: config.add_input({"name": "X", "data_type": "TYPE_FP32"}),
            "input 'X' in auto-complete-config function for model 'add_sub' is missing 'dims' property.")


def test_unknown_property_without_name_raises_key_error_like_the_original():
    with pytest.raises(KeyError):
        _config().add_input({"data_type": "TYPE_FP32", "dims": [1], "bogus": 1})


def test_output_properties():
    config = _config()
    _raises(lambda: config.add_output({"name": "Y", "data_type": "TYPE_FP32", "dims": [1], "optional": True}),
            "output 'Y' in auto-complete-config function for model 'add_sub' contains property other than "
            "'name', 'data_type' and 'dims'.")
    _raises(lambda: config.add_output({"dims": [1], "data_type": "TYPE_FP32"}),
            "output in auto-complete-config function for model 'add_sub' is missing 'name' property.")
    _raises(lambda: config.add_output({"name": "Y", "dims": [1]}),
            "output 'Y' in auto-complete-config function for model 'add_sub' is missing 'data_type' property.")
    _raises(lambda: config.add_output({"name": "Y", "data_type": "TYPE_FP32"}),
            "output 'Y' in auto-complete-config function for model 'add_sub' is missing 'dims' property.")


def test_input_conflicts():
    config = _config()
    _raises(lambda: config.add_input({"name": "IN0", "data_type": "TYPE_INT32", "dims": [4]}),
            "unable to load model 'add_sub', configuration expects datatype TYPE_FP32 for input 'IN0', "
            "model provides TYPE_INT32")
    _raises(lambda: config.add_input({"name": "IN0", "data_type": "TYPE_FP32", "dims": [2]}),
            "model 'add_sub', tensor 'IN0': the model expects dims [2] but the model configuration "
            "specifies dims [4]")
    _raises(lambda: config.add_input({"name": "IN0", "data_type": "TYPE_FP32", "dims": [4], "optional": True}),
            "model 'add_sub', tensor 'IN0': the model expects optional True but the model configuration "
            "specifies optional False")


def test_output_conflicts():
    config = _config()
    config.add_output({"name": "OUT0", "data_type": "TYPE_FP32", "dims": [3]})
    _raises(lambda: config.add_output({"name": "OUT0", "data_type": "TYPE_BOOL", "dims": [3]}),
            "unable to load model 'add_sub', configuration expects datatype TYPE_FP32 for output 'OUT0', "
            "model provides TYPE_BOOL")
    _raises(lambda: config.add_output({"name": "OUT0", "data_type": "TYPE_FP32", "dims": [1, 3]}),
            "model 'add_sub', tensor 'OUT0': the model expects dims [1, 3] but the model configuration "
            "specifies dims [3]")


def test_model_transaction_policy():
    config = _config()
    config.set_model_transaction_policy({"decoupled": True})
    assert config.as_dict()["model_transaction_policy"] == {"decoupled": True}
    config.set_model_transaction_policy({"decoupled": True})
    assert pb_utils.using_decoupled_model_transaction_policy(config.as_dict()) is True
    _raises(lambda: config.set_model_transaction_policy({"decoupled": False}),
            "trying to change decoupled property in auto-complete-config for model 'add_sub', which is "
            "already set to 'True'.")
    _raises(lambda: config.set_model_transaction_policy({"decoupled": True, "other": 1}),
            "model transaction property in auto-complete-config function for model 'add_sub' contains "
            "property other than 'decoupled'.")


def test_using_decoupled_model_transaction_policy_defaults():
    assert pb_utils.using_decoupled_model_transaction_policy({}) is False
    not_decoupled = {"model_transaction_policy": {"decoupled": False}}
    assert pb_utils.using_decoupled_model_transaction_policy(not_decoupled) is False
