MARKER = "env_probe/pystub"
