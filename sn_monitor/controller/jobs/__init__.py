"""Training jobs: DistributedJob specs, their checkpoints and how to tell a complete one."""
