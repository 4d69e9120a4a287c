"""Solar: training and inference operations for video world models."""

__version__ = "0.1.0"
