"""Backbones, attention, camera conditioning, codecs and weight layouts (torch).

Shape legend used across this package: B batch, S tokens, F latent frames, N tokens per frame,
H heads, D head dim, C channels, L prompt tokens.
"""
