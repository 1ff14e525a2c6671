"""A PyTorch CPU model whose `initialize` runs a forward pass on two intra-op threads (GNU
OpenMP's pool, the classic hang of a fork), then serves the same forward pass.

OUTPUT0 is the model applied to INPUT0; INSTANCE names the instance; THREADS is what
torch.get_num_threads() said in initialize and in this execute. LAYERS: 512x512 linear layers
(1 MiB of weights each).
"""

import json

import numpy as np
import torch
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        parameters = {k: v["string_value"] for k, v in json.loads(args["model_config"])["parameters"].items()}
        torch.manual_seed(0)
        torch.set_num_threads(2)
        layers = []
        for _ in range(int(parameters.get("LAYERS", "8"))):
            layers += [torch.nn.Linear(512, 512), torch.nn.Tanh()]
        self.model = torch.nn.Sequential(*layers).eval()
        with torch.inference_mode():
            self.model(torch.randn(256, 512))  # intra-op threads at work in the template
        self.init_threads = torch.get_num_threads()
        self.name = args["model_instance_name"]

    def initialize_instance(self, args):
        self.name = args["model_instance_name"]

    def execute(self, requests):
        responses = []
        for request in requests:
            inputs = torch.from_numpy(pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy())
            with torch.inference_mode():
                outputs = self.model(inputs).numpy()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", outputs),
                pb_utils.Tensor("INSTANCE", np.array([self.name.encode()], dtype=np.object_)),
                pb_utils.Tensor("THREADS", np.array([self.init_threads, torch.get_num_threads()], np.int32))]))
        return responses
