"""Logs one record at each level, VERBOSE first and ERROR last, tagged with TAG; returns TAG."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            tag = pb_utils.get_input_tensor_by_name(request, "TAG").as_numpy()
            logger = pb_utils.Logger
            logger.log_verbose(f"log_levels verbose tag={int(tag[0])}")
            logger.log_info(f"log_levels info tag={int(tag[0])}")
            logger.log_warn(f"log_levels warning tag={int(tag[0])}")
            logger.log_error(f"log_levels error tag={int(tag[0])}")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", tag)]))
        return responses
