MARKER = "env_probe/stub"
