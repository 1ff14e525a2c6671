class TritonPythonModel:
    def initialize(self, args):
        self.value = x  # noqa: F821 - the NameError is the point

    def execute(self, requests):
        return []
