"""Prepared datasets: reading them, and making them from raw images (docs/ARCHITECTURE.md,
"Layout"; the format: docs/FORMAT.md).

    from turbotrain.datasets import open_dataset
    ds = open_dataset("OUT", split="train")
    len(ds), ds.classes, ds.labels, ds.read(i), ds.image(i)
    image, label = ds[i]          # a map-style dataset: torch's DataLoader takes `ds` as it is

Top first, a folder's module-level imports only go down this list: prepare/ (SOURCE -> OUT),
sources/ (what a SOURCE holds), remote/ (a dataset in object storage), beton/ (the format, its
reader and writer, a prepared split), errors.py; turbotrain/files/ below them all.
"""
from __future__ import annotations

import os
from pathlib import Path

from turbotrain.datasets.beton.reader import BetonFile
from turbotrain.datasets.beton.split import PreparedSplit, open_local_dataset
from turbotrain.datasets.remote.urls import is_url

from .errors import DatasetError, NotPrepared

__all__ = ["BetonFile", "DatasetError", "PreparedSplit", "explain", "open_dataset"]


def open_dataset(path: str | os.PathLike, split: str = "train", *, cache_dir=None,
                 cache_limit=None, verify: bool = False, info: dict | None = None
                 ) -> PreparedSplit:
    """Opens split `split` of the prepared dataset at `path` (a folder), or a bare `.beton`,
    or a URL (s3://, gs://, az://, https://: remote/split.py, through a shard cache in
    cache_dir). `verify` (train's --verify-data): a local file whose SHA-256 is not the one
    dataset.json records is refused when opened (a URL's shards are checked by the cache as it
    downloads; a bare .beton records none). `info`: the dataset's dataset.json as another of its
    splits was opened with (that split's `.info`), so it is not read, or fetched, again."""
    if is_url(path):
        # lazy: URL support (the object store client, +50 ms) stays out of `--help`
        from turbotrain.datasets.remote.split import open_remote_dataset
        return open_remote_dataset(path, split, cache_dir, cache_limit, info=info)
    try:
        return open_local_dataset(path, split, verify=verify, info=info)
    except DatasetError as exc:
        # Nothing prepared there, or a file the .beton reader refused (a SOURCE's, maybe).
        bare_file = os.path.isfile(path) and not str(path).endswith(".beton")
        line = _what_it_is(path) if isinstance(exc, NotPrepared) or bare_file else None
        if line is None:
            raise
        raise DatasetError(line) from None


def explain(path: str | os.PathLike, exc: DatasetError) -> str:
    """`exc`'s line; where nothing is prepared at `path`, what it holds instead and the
    commands that prepare it, so that inspect and verify say what `train --data` says."""
    line = _what_it_is(path) if isinstance(exc, NotPrepared) else None
    return line or str(exc)


def _what_it_is(path) -> str | None:
    """For a path that holds no prepared dataset: what it holds instead, and the commands that
    prepare it (a raw folder given as --data: issue 36); None for a file that is no SOURCE
    either, whose own error stands."""
    # lazy: the SOURCE detectors (sources/) run on this error path only
    from turbotrain.datasets.sources.detect import not_prepared_line, source_kind
    if os.path.isfile(path) and source_kind(Path(path)) is None:
        return None
    return not_prepared_line(path)
