"""A stand-in embedding: each word adds to one of 8 slots by its CRC; the vector is normalised."""

import zlib

import numpy as np
import triton_python_backend_utils as pb_utils


def _embed(text):
    vector = np.zeros(8, dtype=np.float32)
    for word in text.split():
        vector[zlib.crc32(word.encode()) % 8] += 1.0
    norm = np.linalg.norm(vector)
    return vector / norm if norm else vector


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            texts = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)
            vectors = np.stack([_embed(text.decode()) for text in texts])
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("embedding", vectors)]))
        return responses
