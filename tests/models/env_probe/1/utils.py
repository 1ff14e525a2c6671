MARKER = "env_probe/utils"
