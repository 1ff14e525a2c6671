MARKER = "env_probe/ipc"
