"""The data contract: indexes, sampling plans, validation selection, pre-encoded samples.

``index``, ``plan`` and ``selection`` are pure Python (no torch); ``sample_io``, ``cameras``,
``stream`` and ``synth`` use torch.
"""
