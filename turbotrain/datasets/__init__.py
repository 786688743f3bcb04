"""Sources, the binary format, its writer and its reader.

    from turbotrain.datasets import open_dataset
    ds = open_dataset("OUT", split="train")
    len(ds), ds.classes, ds.labels, ds.read(i), ds.image(i)
"""
from .dataset import PreparedSplit, open_dataset
from .reader import BetonFile, DatasetError

__all__ = ["BetonFile", "DatasetError", "PreparedSplit", "open_dataset"]
