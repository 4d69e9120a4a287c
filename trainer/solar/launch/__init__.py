"""What ``solar train`` and ``solar infer`` both stand on (torch): the distributed context, one
launch's records and error classes, micro-batches, the weights a launch starts from, and the
conditioning tensors read from ``data.root``. Neither verb's package is imported from here.
"""
