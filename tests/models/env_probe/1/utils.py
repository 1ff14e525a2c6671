MARKER = "env_probe/utils"


def triple(value):
    return 3 * value
