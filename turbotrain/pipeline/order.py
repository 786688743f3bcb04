"""Which samples each rank sees, in which order: shared by every pipeline that controls its order.

One epoch's order is a pure function of (seed, epoch):

1. ``epoch_permutation(n, seed, epoch)``: numpy's ``Generator(PCG64(SeedSequence([seed, epoch])))``
   permutes ``range(n)`` (training); evaluation keeps ``range(n)``.
2. The global order is split across ranks DistributedSampler-style (``order[rank::world_size]``)
   into disjoint shards of equal size:

   * ``drop_last=True`` (the training default): the tail of the permutation is dropped so that
     every rank gets the same number of *full* batches, ``n // (world_size * batch_size)``. A
     different tail is dropped each epoch, so no sample is left out for good.
   * ``drop_last=False`` (the evaluation default): nothing is dropped and the last batch may be
     short. With ``world_size > 1`` and ``n % world_size != 0`` the order is padded by repeating
     its first ``world_size - n % world_size`` entries (as torch's DistributedSampler does), so the
     shards stay equal; with one rank nothing is padded and every sample appears exactly once.

3. A rank's shard is cut into consecutive batches of ``batch_size``.

Because the order does not depend on workers, threads or the pipeline, `pytorch`, `resident`,
`dali` and `ffcv` feed the same samples in the same batches, and a run resumed at batch k of an
epoch continues with exactly the batches it would have seen (``SampleOrder.batches(epoch)[k:]``).
"""
from __future__ import annotations

import numpy as np


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
    """The order of all samples in one epoch before sharding: shuffled for training, else 0..n-1."""
    if shuffle:
        return epoch_permutation(num_samples, seed, epoch)
    return np.arange(num_samples, dtype=np.int64)


def shard_size(num_samples: int, *, world_size: int, batch_size: int, drop_last: bool) -> int:
    """How many samples every rank sees in one epoch (equal for all ranks)."""
    _check_layout(world_size=world_size, batch_size=batch_size)
    if drop_last:
        return (num_samples // (world_size * batch_size)) * batch_size
    return -(-num_samples // world_size)


def num_batches(num_samples: int, *, world_size: int, batch_size: int, drop_last: bool) -> int:
    """The number of batches every rank yields per epoch (equal for all ranks)."""
    per_rank = shard_size(num_samples, world_size=world_size, batch_size=batch_size,
                          drop_last=drop_last)
    return per_rank // batch_size if drop_last else -(-per_rank // batch_size)


def shard(order: np.ndarray, *, rank: int, world_size: int, batch_size: int,
          drop_last: bool) -> np.ndarray:
    """This rank's samples, in order, from the epoch's global `order` (see the module docstring)."""
    _check_layout(world_size=world_size, batch_size=batch_size, rank=rank)
    n = len(order)
    per_rank = shard_size(n, world_size=world_size, batch_size=batch_size, drop_last=drop_last)
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
        return shard(order, rank=self.rank, world_size=self.world_size,
                     batch_size=self.batch_size, drop_last=self.drop_last)

    def batches(self, epoch: int) -> list[np.ndarray]:
        """This rank's batches of sample indices for `epoch`; ``len()`` of them."""
        return split_batches(self.samples(epoch), self.batch_size)


def _check_layout(*, world_size: int, batch_size: int, rank: int = 0) -> None:
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1 (got {batch_size})")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size (got rank={rank}, world_size={world_size})")
