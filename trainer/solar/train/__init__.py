"""The training engine: launch, distributed context, step loop, checkpoints, EMA, run files."""
