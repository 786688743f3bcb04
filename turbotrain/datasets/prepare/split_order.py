"""The order of a Source's samples inside its splits: a val split carved from train
(`with_val_split`) and the shuffled order a sharded train split is stored in (`shuffled_train`).
Both are pure functions of the source and a seed, the same on every machine and every --part."""
from __future__ import annotations

import dataclasses

import numpy as np

from turbotrain.datasets.beton.layout import MAX_CLASSES
from turbotrain.datasets.sources.source import Source, SourceError


def with_val_split(source: Source, fraction: float, seed: int = 0) -> Source:
    """Move round(fraction * n) samples of each class (rounded half up; n = the class's train
    samples) to a new "val" split, keeping at least one in train; classes with one sample stay
    whole. Deterministic: the same source, fraction and seed give the same indices on any
    machine and numpy version. Both splits keep the source's sample order."""
    if not 0 < fraction < 1:
        raise SourceError(f"val fraction {fraction} must be between 0 and 1 (exclusive)")
    if set(source.splits) != {"train"}:
        raise SourceError(f"{source.path} already has a val split; do not ask for another")
    train = source.splits["train"]
    labels = train.labels
    order = np.argsort(labels, kind="stable")  # grouped by class, source order within each
    classes, starts, counts = np.unique(labels[order], return_index=True, return_counts=True)
    is_val = np.zeros(len(train), dtype=bool)
    for label, start, count in zip(classes.tolist(), starts.tolist(), counts.tolist()):
        take = min(int(np.floor(fraction * count + 0.5)), count - 1)
        if take <= 0:
            continue
        # Raw PCG64 output is a fixed algorithm (Generator.choice/permutation may change between
        # numpy releases); one stream per class, so adding a class does not reshuffle the others.
        keys = np.random.PCG64(np.random.SeedSequence([seed, label])).random_raw(count)
        is_val[order[start:start + count][np.argsort(keys, kind="stable")[:take]]] = True
    splits = {"train": train.subset(np.flatnonzero(~is_val)),
              "val": train.subset(np.flatnonzero(is_val))}
    return dataclasses.replace(source, splits=splits)


def shuffled_train(source: Source, seed: int = 0) -> Source:
    """The source with its train split in a seeded shuffle of its order, as a sharded dataset
    stores it. Sources list samples by class (ImageFolder, most CSVs, some arrays), so shards
    in source order would each hold a class or two, and the quasi-random order, which reads a
    window of a few shards at a time (pipeline/order.py), would train on few-class batches.
    Raw PCG64 keys, as in with_val_split, so every part of a conversion (--part) and every
    machine computes the same order; the stream is keyed [seed, MAX_CLASSES], which no class's
    val stream (keyed [seed, label], label < MAX_CLASSES) can equal. The val split keeps its
    order: evaluation reads it in sequence."""
    train = source.splits.get("train")
    if train is None or len(train) < 2:
        return source
    splits = {**source.splits, "train": train.subset(shuffled_order(len(train), seed))}
    return dataclasses.replace(source, splits=splits)


def shuffled_order(count: int, seed: int = 0) -> np.ndarray:
    """Source index of each stored sample of a sharded train split (shuffled_train)."""
    keys = np.random.PCG64(np.random.SeedSequence([seed, MAX_CLASSES])).random_raw(count)
    return np.argsort(keys, kind="stable")
