"""initialize raises RuntimeError("cannot start")."""


class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("cannot start")

    def execute(self, requests):
        return []
