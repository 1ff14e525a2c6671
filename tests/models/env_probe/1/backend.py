MARKER = "env_probe/backend"
