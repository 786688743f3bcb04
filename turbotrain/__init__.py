"""turbotrain: a compiled, high-performance image data pipeline plus trainer for PyTorch."""
__version__ = "0.1.0"
