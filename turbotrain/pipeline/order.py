"""Which samples each rank sees, in which order: shared by every pipeline that controls its order.

One epoch's order is a pure function of (seed, epoch):

1. ``epoch_permutation(n, seed, epoch)``: numpy's ``Generator(PCG64(SeedSequence([seed, epoch])))``
   permutes ``range(n)`` (training); evaluation keeps ``range(n)``.
2. The global order is split across ranks DistributedSampler-style (``order[rank::world_size]``)
   into disjoint slices of equal size, one a rank (a rank's slice; "shard" is a split's
   `.beton` file, datasets/beton/shards.py):

   * ``drop_last=True`` (the training default): the tail of the permutation is dropped so that
     every rank gets the same number of *full* batches, ``n // (world_size * batch_size)``. A
     different tail is dropped each epoch, so no sample is left out for good.
   * ``drop_last=False`` (the evaluation default): nothing is dropped and the last batch may be
     short. With ``world_size > 1`` and ``n % world_size != 0`` the order is padded by repeating
     its first ``world_size - n % world_size`` entries (as torch's DistributedSampler does), so the
     slices stay equal; with one rank nothing is padded and every sample appears exactly once.

3. A rank's slice is cut into consecutive batches of ``batch_size``.

Because the order does not depend on workers, threads or the pipeline, `pytorch`, `resident`,
`dali` and `ffcv` feed the same samples in the same batches, and a run resumed at batch k of an
epoch continues with exactly the batches it would have seen (``SampleOrder.batches(epoch)[k:]``).

Quasi-random (``--order quasi-random``, `QuasiRandomOrder`), for a split larger than memory or the
remote cache: a full permutation touches every shard of the split all the time, so each read is
a page-cache miss (or a shard download) for one image. Instead, still a pure function of
(seed, epoch), and only for training (evaluation stays sequential):

1. Blocks: the split's shards (``split.shard_bounds``); an unsharded split (or one shard) is cut
   into virtual blocks of consecutive samples of about ``VIRTUAL_BLOCK_BYTES`` (64 MiB) of
   stored bytes, equal in sample count.
2. ``Generator(PCG64(SeedSequence([seed, epoch, 1])))`` permutes the blocks, and their samples
   are laid end to end in that order. Rank r takes the r-th contiguous stretch of
   ``slice_size(...)`` samples: each rank reads only the blocks of its stretch, and only the
   two blocks at its ends are shared with a neighbour rank (read in part by each). The counts
   are equal, so nothing beyond ``n % (world_size * batch_size)`` samples is dropped, exactly as
   in the random order, and what is dropped is the end of the epoch's last block, another one
   each epoch. (Dealing whole shards to ranks instead keeps every shard on one rank, but the
   ranks' counts differ by up to a shard and all must be cut to the smallest: 140 shards on 16
   ranks would drop 12 shards, 8.6 % of the data, every epoch; ``test_order.py`` measures both.)
   Without drop_last (never the case when training by default), the stretches are padded by
   wrapping around to the sequence's start, as the random order pads.
3. A rank's stretch is a sequence of pieces (its part of each block), read in consecutive
   groups of at most ``window`` pieces (``--order-window``, default 4; ``ceil(k / window)``
   groups of near-equal piece counts, so no group is left with one piece). The samples of a
   group are shuffled together (a second generator seeded with [seed, epoch, 2, rank]); a group
   is finished before the next starts. So at most ``window`` blocks are being read at any
   point of the epoch (the memory or cache the order needs), and one batch draws from at most
   two consecutive groups.

The catch: a window mixes only ``window`` blocks. A split stored in class order (an unsharded
ImageFolder split is; a sharded train split is stored shuffled, docs/FORMAT.md) gives batches of
a few classes; `train/plan` therefore picks quasi-random by itself only for splits whose
neighbouring samples mostly differ in label (plan/rules.py `order`).

Each pipeline tells the split which shards this rank reads next, in order
(``split.will_read(shards)``, see ordered.py), so a remote cache can prefetch them.
"""
from __future__ import annotations

import numpy as np

RANDOM = "random"
QUASI_RANDOM = "quasi-random"
ORDERS = (RANDOM, QUASI_RANDOM)
# Blocks mixed at a time by the quasi-random order: 4 x 64 MiB virtual blocks = 256 MiB of page
# cache, or 4 shards in a remote cache (4 GiB with 1 GB shards).
DEFAULT_WINDOW = 4
# An unsharded split's virtual blocks: 64 MiB read in order streams at the disk's sequential
# speed (readahead), and a 100 GB split still has ~1,500 blocks to permute.
VIRTUAL_BLOCK_BYTES = 64 * 2**20
# Stream tags of the quasi-random order's generators, so that they never share a stream with
# `epoch_permutation` of the same (seed, epoch).
_BLOCK_STREAM, _WINDOW_STREAM = 1, 2


def epoch_permutation(num_samples: int, seed: int, epoch: int) -> np.ndarray:
    """The global training order of one epoch: a permutation of ``range(num_samples)`` (int64).

    The generator is seeded with the pair (seed, epoch) through a SeedSequence, so neighbouring
    epochs or seeds give unrelated permutations.
    """
    if seed < 0 or epoch < 0:
        raise ValueError(f"seed and epoch must be >= 0 (got seed={seed}, epoch={epoch})")
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch])))
    return rng.permutation(num_samples).astype(np.int64, copy=False)


def global_order(num_samples: int, *, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The order of all samples in one epoch, before it is sliced across the ranks: shuffled for
    training, else 0..n-1."""
    if shuffle:
        return epoch_permutation(num_samples, seed, epoch)
    return np.arange(num_samples, dtype=np.int64)


def slice_size(num_samples: int, *, world_size: int, batch_size: int, drop_last: bool) -> int:
    """How many samples every rank sees in one epoch (equal for all ranks)."""
    _check_layout(world_size=world_size, batch_size=batch_size)
    if drop_last:
        return (num_samples // (world_size * batch_size)) * batch_size
    return -(-num_samples // world_size)


def num_batches(num_samples: int, *, world_size: int, batch_size: int, drop_last: bool) -> int:
    """The number of batches every rank yields per epoch (equal for all ranks)."""
    per_rank = slice_size(num_samples, world_size=world_size, batch_size=batch_size,
                          drop_last=drop_last)
    return per_rank // batch_size if drop_last else -(-per_rank // batch_size)


def rank_slice(order: np.ndarray, *, rank: int, world_size: int, batch_size: int,
               drop_last: bool) -> np.ndarray:
    """This rank's samples, in order, from the epoch's global `order` (see the module docstring)."""
    _check_layout(world_size=world_size, batch_size=batch_size, rank=rank)
    n = len(order)
    per_rank = slice_size(n, world_size=world_size, batch_size=batch_size, drop_last=drop_last)
    total = per_rank * world_size
    if total > n:  # drop_last=False with a remainder: pad with the first entries
        order = np.concatenate([order, order[: total - n]])
    return order[rank:total:world_size]


def split_batches(samples: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """Consecutive batches of `batch_size` (the last one may be short)."""
    return [samples[i:i + batch_size] for i in range(0, len(samples), batch_size)]


class SampleOrder:
    """The batches one rank yields, epoch by epoch: ``order.batches(epoch)[k]`` is batch k.

        order = SampleOrder.from_options(len(dataset), options)
        for indices in order.batches(epoch)[start:]: ...
    """

    def __init__(self, num_samples: int, *, batch_size: int, seed: int = 0, shuffle: bool = True,
                 rank: int = 0, world_size: int = 1, drop_last: bool = True):
        _check_layout(world_size=world_size, batch_size=batch_size, rank=rank)
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.rank = rank
        self.world_size = world_size
        self.drop_last = drop_last

    @classmethod
    def from_options(cls, num_samples: int, options) -> "SampleOrder":
        """From a PipelineOptions: shuffled when training, drop_last from `options.drops_last`."""
        return cls(num_samples, batch_size=options.batch_size, seed=options.seed,
                   shuffle=options.train, rank=options.rank, world_size=options.world_size,
                   drop_last=options.drops_last)

    def __len__(self) -> int:
        return num_batches(self.num_samples, world_size=self.world_size,
                           batch_size=self.batch_size, drop_last=self.drop_last)

    def samples(self, epoch: int) -> np.ndarray:
        """This rank's samples for `epoch`, in the order they are yielded (int64)."""
        order = global_order(self.num_samples, seed=self.seed, epoch=epoch, shuffle=self.shuffle)
        return rank_slice(order, rank=self.rank, world_size=self.world_size,
                          batch_size=self.batch_size, drop_last=self.drop_last)

    def batches(self, epoch: int) -> list[np.ndarray]:
        """This rank's batches of sample indices for `epoch`; ``len()`` of them."""
        return split_batches(self.samples(epoch), self.batch_size)


def order_for(dataset, options) -> SampleOrder:
    """The order `options` ask for (``options.order``) over `dataset`: quasi-random only when
    training; evaluation, and the random order, are `SampleOrder`'s."""
    if options.train and options.order == QUASI_RANDOM:
        return QuasiRandomOrder(block_bounds(dataset), batch_size=options.batch_size,
                                seed=options.seed, rank=options.rank,
                                world_size=options.world_size, drop_last=options.drops_last,
                                window=options.order_window)
    return SampleOrder.from_options(len(dataset), options)


def stored_bytes(dataset) -> int:
    """The bytes a split takes on disk: dataset.json's total, else its shards' (`nbytes`), else
    its one file's (a bare .beton)."""
    info = getattr(dataset, "info", None) or {}
    total = info.get("splits", {}).get(getattr(dataset, "split", None), {}).get("bytes")
    if total is not None:
        return int(total)
    if getattr(dataset, "nbytes", 0):
        return int(dataset.nbytes)
    beton = getattr(dataset, "beton", None)  # a split of one file
    return int(beton.file_size) if beton is not None else 0


def virtual_blocks(num_samples: int, nbytes: int, block_bytes: int) -> np.ndarray:
    """Bounds (0, ..., num_samples) of consecutive blocks of about `block_bytes` stored bytes
    each, equal in sample count (an average: only the split's total size is used)."""
    count = int(min(max(1, round(nbytes / block_bytes)), max(1, num_samples)))
    return (np.arange(count + 1, dtype=np.int64) * num_samples) // count


def block_bounds(dataset) -> np.ndarray:
    """The quasi-random order's blocks of `dataset`: its shards (``shard_bounds``) when it has
    two or more, else `virtual_blocks`."""
    bounds = getattr(dataset, "shard_bounds", None)
    if bounds is not None and len(bounds) > 2:
        return np.asarray(bounds, dtype=np.int64)
    return virtual_blocks(len(dataset), stored_bytes(dataset), VIRTUAL_BLOCK_BYTES)


def shards_in_order(shard_bounds, samples: np.ndarray) -> list[int]:
    """The shards `samples` fall in, each once, in the order they are first read."""
    if len(samples) == 0:
        return []
    shard = np.searchsorted(np.asarray(shard_bounds), samples, side="right") - 1
    ids, first = np.unique(shard, return_index=True)
    return ids[np.argsort(first)].tolist()


class QuasiRandomOrder(SampleOrder):
    """The quasi-random training order over blocks with `bounds` (0, n0, n0 + n1, ..., n):
    see the module docstring. Same interface and batch count as `SampleOrder`."""

    def __init__(self, bounds, *, batch_size: int, seed: int = 0, rank: int = 0,
                 world_size: int = 1, drop_last: bool = True, window: int = DEFAULT_WINDOW):
        bounds = np.asarray(bounds, dtype=np.int64)
        if bounds.ndim != 1 or len(bounds) < 2 or bounds[0] != 0 or (np.diff(bounds) < 0).any():
            raise ValueError("block bounds must rise from 0 to the number of samples")
        if window < 1:
            raise ValueError(f"the quasi-random window must be >= 1 block (got {window})")
        super().__init__(int(bounds[-1]), batch_size=batch_size, seed=seed, shuffle=True,
                         rank=rank, world_size=world_size, drop_last=drop_last)
        self.bounds = bounds
        self.window = window

    def pieces(self, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(block, first sample, sample count) of each piece this rank reads in `epoch`, in
        reading order: its stretch of the epoch's permuted blocks (module docstring, step 2)."""
        n = self.num_samples
        perm = _generator(self.seed, epoch, _BLOCK_STREAM).permutation(len(self.bounds) - 1)
        sizes = np.diff(self.bounds)[perm]
        ends = np.cumsum(sizes)
        begins = ends - sizes
        per_rank = slice_size(n, world_size=self.world_size, batch_size=self.batch_size,
                              drop_last=self.drop_last)
        blocks, firsts, counts = [], [], []
        lo, hi = self.rank * per_rank, (self.rank + 1) * per_rank
        while lo < hi:  # positions past n wrap to the start (padding without drop_last)
            a = lo % n
            b = a + min(hi - lo, n - a)
            j = np.arange(np.searchsorted(ends, a, side="right"),
                          np.searchsorted(begins, b, side="left"))
            start, stop = np.maximum(begins[j], a), np.minimum(ends[j], b)
            keep = stop > start
            blocks.append(perm[j][keep])
            firsts.append((self.bounds[perm[j]] + start - begins[j])[keep])
            counts.append((stop - start)[keep])
            lo += b - a
        if not blocks:
            return (np.zeros(0, np.int64),) * 3
        return np.concatenate(blocks), np.concatenate(firsts), np.concatenate(counts)

    def groups(self, epoch: int) -> np.ndarray:
        """The group of each of `pieces(epoch)`: ceil(k / window) groups of consecutive pieces,
        near-equal in piece count (module docstring, step 3)."""
        k = len(self.pieces(epoch)[0])
        return _group_of_piece(k, self.window)

    def samples(self, epoch: int) -> np.ndarray:
        _, firsts, counts = self.pieces(epoch)
        total = int(counts.sum())
        offsets = np.cumsum(counts) - counts
        ids = np.repeat(firsts - offsets, counts) + np.arange(total, dtype=np.int64)
        # Sort key: the group, plus a uniform draw in [0, 0.5) that shuffles within it (never
        # rounding up to the next group). One float argsort: 0.2 s for ImageNet's 1.28 M
        # samples, against 1.1 s for a two-key lexsort.
        keys = np.repeat(_group_of_piece(len(counts), self.window).astype(np.float64), counts)
        keys += 0.5 * _generator(self.seed, epoch, _WINDOW_STREAM, self.rank).random(total)
        return ids[np.argsort(keys)]


def _group_of_piece(k: int, window: int) -> np.ndarray:
    groups = -(-k // window)
    return (np.arange(k, dtype=np.int64) * groups) // max(1, k)


def _generator(seed: int, epoch: int, *stream: int) -> np.random.Generator:
    if seed < 0 or epoch < 0:
        raise ValueError(f"seed and epoch must be >= 0 (got seed={seed}, epoch={epoch})")
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, *stream])))


def _check_layout(*, world_size: int, batch_size: int, rank: int = 0) -> None:
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1 (got {batch_size})")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size (got rank={rank}, world_size={world_size})")
