"""Training objectives as pure functions of tensors (no modules, no I/O, no global RNG)."""
