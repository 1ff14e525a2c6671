"""finalize never returns in time: the shutdown ladder must still end the stub."""

import time


class TritonPythonModel:
    def execute(self, requests):
        return [None for _ in requests]

    def finalize(self):
        time.sleep(600)
