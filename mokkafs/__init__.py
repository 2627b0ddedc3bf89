"""mokkafs: a simulated NVIDIA GPU node for machines without GPUs."""

__version__ = "0.1.0"
