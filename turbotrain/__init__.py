"""turbotrain: a compiled, high-performance image data pipeline plus trainer for PyTorch.

`from turbotrain import Loader` gives the pipelines to your own training loop
(train/engine/loader.py).
"""
__version__ = "0.1.0"
__all__ = ["Loader", "LoaderError", "__version__"]


def __getattr__(name: str):
    # Imported on first use: `turbotrain --help` must not pay for torch (~1.5 s).
    if name in ("Loader", "LoaderError"):
        # lazy: `import turbotrain` and `--help` must not pay for torch (~1.5 s)
        from .train.engine import loader
        return getattr(loader, name)
    raise AttributeError(f"module 'turbotrain' has no attribute {name!r}")
