"""Multiplexing test model (sync execute, sync load): one sub-model per `multiplexed_model_id`.

OUTPUT0 = INPUT0 * the sub-model's factor (derived from its id); HIT = 1 when this request found
its sub-model already loaded; SERIAL = which load (on this instance) made the sub-model;
INSTANCE = the instance name; EVENTS = JSON list of this instance's "load:<id>", "fail:<id>" and
"unload:<id>" events in order. Loads take LOAD_DELAY_MS; ids starting with "bad" fail to load.
A request parameter `exec_ms` makes its execute sleep that long.
"""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def factor_of(model_id):
    return 1 + sum(model_id.encode()) % 7


class SubModel:
    def __init__(self, model_id, serial):
        self.model_id = model_id
        self.serial = serial
        self.factor = factor_of(model_id)

    def __call__(self, values):
        return values * np.float32(self.factor)


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.delay = float(parameters.get("LOAD_DELAY_MS", {}).get("string_value", "0")) / 1000
        self.instance = args["model_instance_name"]
        self.events = []
        self.serial = 0

    def load_multiplexed(self, model_id):
        time.sleep(self.delay)
        if model_id.startswith("bad"):
            self.events.append("fail:" + model_id)
            raise ValueError(f"no weights for {model_id}")
        self.serial += 1
        self.events.append("load:" + model_id)
        return SubModel(model_id, self.serial)

    def unload_multiplexed(self, model_id, sub_model):
        assert sub_model.model_id == model_id
        self.events.append("unload:" + model_id)

    def execute(self, requests):
        responses = []
        for request in requests:
            loads_before = self.serial
            try:
                sub_model = pb_utils.get_multiplexed_model(request)
            except pb_utils.TritonModelException as exc:  # fails this request only
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))))
                continue
            time.sleep(json.loads(request.parameters()).get("exec_ms", 0) / 1000)
            values = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            outputs = {
                "OUTPUT0": sub_model(values),
                "HIT": np.array([int(self.serial == loads_before)], dtype=np.int32),
                "SERIAL": np.array([sub_model.serial], dtype=np.int32),
                "INSTANCE": np.array([self.instance.encode()], dtype=np.object_),
                "EVENTS": np.array([json.dumps(self.events).encode()], dtype=np.object_),
            }
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(k, v) for k, v in outputs.items()]))
        return responses
