"""order.py: one permutation per (seed, epoch), equal disjoint shards, clear drop_last; the
quasi-random order (blocks, windows, ranks), and every pipeline feeding it."""
from __future__ import annotations

import numpy as np
import pytest

from turbotrain.pipeline import PipelineOptions, PipelineUnavailable, build_pipeline
from turbotrain.pipeline.order import (QuasiRandomOrder, SampleOrder, block_bounds,
                                       epoch_permutation, num_batches, order_for, shards_in_order,
                                       virtual_blocks)

from .conftest import build, product_pipelines, run_epoch


def test_permutation_is_a_function_of_seed_and_epoch():
    a = epoch_permutation(100, seed=1, epoch=2)
    assert sorted(a.tolist()) == list(range(100)) and a.dtype == np.int64
    assert np.array_equal(a, epoch_permutation(100, seed=1, epoch=2))
    assert not np.array_equal(a, epoch_permutation(100, seed=1, epoch=3))
    assert not np.array_equal(a, epoch_permutation(100, seed=2, epoch=2))


def test_eval_order_is_sequential():
    order = SampleOrder(10, batch_size=4, shuffle=False, drop_last=False)
    assert [b.tolist() for b in order.batches(5)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


@pytest.mark.parametrize("n, world, batch", [(100, 1, 8), (100, 3, 8), (7, 4, 2), (64, 2, 32)])
def test_drop_last_gives_equal_full_batches_on_disjoint_shards(n, world, batch):
    shards = [SampleOrder(n, batch_size=batch, rank=r, world_size=world, drop_last=True)
              for r in range(world)]
    batches = [s.batches(1) for s in shards]
    assert all(len(b) == len(shards[0]) == n // (world * batch) for b in batches)
    assert all(len(x) == batch for b in batches for x in b)
    seen = np.concatenate([x for b in batches for x in b]) if batches[0] else np.array([])
    assert len(set(seen.tolist())) == len(seen)


@pytest.mark.parametrize("n, world, batch", [(100, 1, 8), (100, 3, 8), (7, 4, 2), (5, 8, 4)])
def test_keep_last_covers_every_sample_with_equal_shards(n, world, batch):
    shards = [SampleOrder(n, batch_size=batch, rank=r, world_size=world, drop_last=False)
              for r in range(world)]
    samples = [s.samples(0) for s in shards]
    assert len({len(x) for x in samples}) == 1
    assert set(np.concatenate(samples).tolist()) == set(range(n))
    assert sum(map(len, samples)) == -(-n // world) * world  # padding < world_size entries
    assert len(shards[0].batches(0)) == len(shards[0]) == num_batches(
        n, world_size=world, batch_size=batch, drop_last=False)


def test_single_rank_without_drop_last_sees_each_sample_once():
    order = SampleOrder(10, batch_size=3, drop_last=False, seed=4)
    flat = np.concatenate(order.batches(0))
    assert sorted(flat.tolist()) == list(range(10)) and len(order) == 4


def test_bad_layout_is_refused():
    with pytest.raises(ValueError, match="rank"):
        SampleOrder(10, batch_size=2, rank=2, world_size=2)
    with pytest.raises(ValueError, match="batch_size"):
        SampleOrder(10, batch_size=0)


# ---------------------------------------------------------------------------- quasi-random

def quasi(bounds, *, rank=0, world=1, batch=4, seed=0, window=2, drop_last=True):
    return QuasiRandomOrder(bounds, batch_size=batch, seed=seed, rank=rank, world_size=world,
                            drop_last=drop_last, window=window)


def uneven_bounds(count: int, seed: int = 0, low: int = 20, high: int = 60) -> np.ndarray:
    sizes = np.random.default_rng(seed).integers(low, high, size=count)
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def block_of(bounds, samples):
    return np.searchsorted(bounds, samples, side="right") - 1


def test_quasi_random_is_a_function_of_seed_and_epoch():
    bounds = uneven_bounds(12)
    a = quasi(bounds, seed=1).samples(2)
    assert np.array_equal(a, quasi(bounds, seed=1).samples(2)) and a.dtype == np.int64
    assert sorted(a.tolist()) != a.tolist()
    assert not np.array_equal(a, quasi(bounds, seed=1).samples(3))
    assert not np.array_equal(a, quasi(bounds, seed=2).samples(2))
    # Each epoch reads the blocks in another order.
    firsts = {tuple(quasi(bounds, seed=1).pieces(e)[0][:4]) for e in range(5)}
    assert len(firsts) == 5


@pytest.mark.parametrize("world, batch, drop_last", [(1, 4, True), (3, 8, True), (4, 5, True),
                                                     (3, 8, False), (5, 16, False)])
def test_quasi_random_ranks_are_disjoint_and_read_only_their_blocks(world, batch, drop_last):
    bounds = uneven_bounds(17, seed=world)
    n = int(bounds[-1])
    orders = [quasi(bounds, rank=r, world=world, batch=batch, drop_last=drop_last)
              for r in range(world)]
    samples = [o.samples(4) for o in orders]
    assert len({len(s) for s in samples}) == 1  # equal shares: equal batch counts
    assert all(len(o) == len(orders[0]) == len(SampleOrder(n, batch_size=batch, world_size=world,
                                                           drop_last=drop_last))
               for o in orders)
    blocks_read = []
    for o, s in zip(orders, samples):
        blocks, firsts, counts = o.pieces(4)
        assert len(set(blocks.tolist())) == len(blocks)  # each block once (no wrap here)
        assert set(block_of(bounds, s).tolist()) == set(blocks.tolist())
        assert int(counts.sum()) == len(s) == len(set(s.tolist()))
        blocks_read.append(set(blocks.tolist()))
    union = np.concatenate(samples)
    if drop_last:
        assert len(set(union.tolist())) == len(union)  # disjoint
    else:
        assert set(union.tolist()) == set(range(n)) and len(union) - n < world
    # Only a rank's first and last blocks can be shared with its neighbours.
    for r in range(world - 1):
        assert len(blocks_read[r] & blocks_read[r + 1]) <= 1
    for r in range(world):
        for q in range(r + 2, world):
            assert not (blocks_read[r] & blocks_read[q]) or not drop_last


def test_quasi_random_drops_no_more_than_the_random_order():
    """Uneven shards: the contiguous stretches keep every rank's count equal, so an epoch drops
    only n % (ranks x batch) samples, like the random order. Dealing whole shards to ranks
    (the alternative in order.py's docstring) would cut every rank to the one with the fewest
    samples: measured here on the same shards."""
    world, batch = 16, 32
    bounds = uneven_bounds(140, seed=3, low=900, high=1100)  # ~1,000 samples a shard
    n = int(bounds[-1])
    kept = sum(len(quasi(bounds, rank=r, world=world, batch=batch).samples(0))
               for r in range(world))
    assert n - kept == n % (world * batch) < world * batch
    sizes = np.diff(bounds)
    perm = np.random.default_rng(0).permutation(len(sizes))
    dealt = [sizes[perm[r::world]].sum() for r in range(world)]
    dealing_drops = n - world * (min(dealt) // batch * batch)
    # 140 = 8 x 16 + 12: twelve ranks get 9 shards, four get 8, and everyone is cut to the
    # smallest share: 16,226 of 140,130 samples (11.6 %) per epoch with these shards, against
    # 354 (0.25 %) here.
    assert dealing_drops > 0.08 * n and n - kept < 0.004 * n


def test_quasi_random_drops_another_tail_each_epoch_and_covers_everything():
    bounds = uneven_bounds(9, seed=5)
    n = int(bounds[-1])
    seen, dropped = set(), []
    for epoch in range(4):
        epoch_samples = set(np.concatenate([quasi(bounds, rank=r, world=2, batch=16)
                                            .samples(epoch) for r in range(2)]).tolist())
        assert n - len(epoch_samples) == n % 32
        dropped.append(frozenset(range(n)) - epoch_samples)
        seen |= epoch_samples
    assert len(set(dropped)) == 4
    assert seen == set(range(n))  # every sample within 4 epochs


@pytest.mark.parametrize("window", [1, 2, 3, 4])
def test_quasi_random_window_bounds_the_blocks_in_use(window):
    """A rank's pieces are read in consecutive groups of <= window; a group ends before the
    next begins, so at most `window` blocks are open at any point, and one batch draws from at
    most two consecutive groups (blocks < 2 x window apart in the rank's sequence)."""
    bounds = uneven_bounds(30, seed=window, low=40, high=80)
    order = quasi(bounds, rank=1, world=2, batch=8, window=window)
    blocks, _, _ = order.pieces(3)
    groups = order.groups(3)
    assert np.bincount(groups).max() <= window and (np.diff(groups) >= 0).all()
    if len(blocks) > window:
        assert np.bincount(groups).min() >= 2 or window == 1
    position = {int(b): k for k, b in enumerate(blocks)}  # block -> place in the sequence
    samples = order.samples(3)
    place = np.array([position[int(b)] for b in block_of(bounds, samples)])
    group = groups[place]
    assert (np.diff(group) >= 0).all()  # groups in order, never revisited
    first = {p: np.flatnonzero(place == p)[[0, -1]] for p in set(place.tolist())}
    for i in range(len(samples)):
        open_now = sum(1 for lo, hi in first.values() if lo <= i <= hi)
        assert open_now <= window
    assert np.array_equal(np.concatenate(order.batches(3)), samples)
    for k in range(len(order)):  # batch k is samples[8k:8k + 8]
        spots, in_groups = place[8 * k:8 * k + 8], group[8 * k:8 * k + 8]
        assert spots.max() - spots.min() < 2 * window
        assert in_groups.max() - in_groups.min() <= 1


def test_quasi_random_mixes_the_blocks_of_a_window():
    bounds = np.arange(0, 801, 100)  # 8 blocks of 100
    batches = quasi(bounds, batch=16, window=4).batches(0)
    kinds = [len(set(block_of(bounds, b).tolist())) for b in batches]
    assert np.mean(kinds) > 3  # 16 samples from 4 equal blocks: 3.6 blocks on average


def test_resuming_at_batch_k_gives_the_tail():
    bounds = uneven_bounds(10)
    full = quasi(bounds, world=2, rank=1, batch=8).batches(7)
    again = quasi(bounds, world=2, rank=1, batch=8).batches(7)
    assert [b.tolist() for b in again[5:]] == [b.tolist() for b in full[5:]]


def test_virtual_blocks_and_the_order_for_options():
    assert virtual_blocks(1000, 640 * 2**20, 64 * 2**20).tolist() == list(range(0, 1001, 100))
    assert virtual_blocks(3, 10 * 2**30, 64 * 2**20).tolist() == [0, 1, 2, 3]  # <= 1 a sample
    assert virtual_blocks(10, 2**20, 64 * 2**20).tolist() == [0, 10]

    class Split:
        info, split = {"splits": {"train": {"bytes": 256 * 2**20}}}, "train"

        def __len__(self):
            return 400
    opts = dict(batch_size=8, image_size=16, device="cpu", seed=1)
    train = order_for(Split(), PipelineOptions(train=True, order="quasi-random", **opts))
    assert isinstance(train, QuasiRandomOrder) and train.bounds.tolist() == [0, 100, 200, 300, 400]
    assert type(order_for(Split(), PipelineOptions(train=True, **opts))) is SampleOrder
    evaluation = order_for(Split(), PipelineOptions(train=False, order="quasi-random", **opts))
    assert np.array_equal(np.concatenate(evaluation.batches(3)), np.arange(400))
    sharded = Split()
    sharded.shard_bounds = np.array([0, 150, 400])
    assert block_bounds(sharded).tolist() == [0, 150, 400]
    assert shards_in_order([0, 150, 400], np.array([390, 5, 151, 6])) == [1, 0]
    with pytest.raises(ValueError, match="order must be one of"):
        PipelineOptions(train=True, order="sorted", **opts)
    with pytest.raises(ValueError, match="window"):
        quasi([0, 10], window=0)


# ---------------------------------------------------------------------------- pipelines

class ShardedView:
    """A split seen as shards of the given bounds (what a sharded PreparedSplit offers the
    order), recording the `will_read` hints the pipelines give."""

    def __init__(self, split, bounds):
        self._split = split
        self.shard_bounds = np.asarray(bounds, dtype=np.int64)
        self.hints: list[list[int]] = []

    def __len__(self):
        return len(self._split)

    def will_read(self, shards):
        self.hints.append(list(shards))

    def __getattr__(self, name):
        return getattr(self._split, name)


QUASI = dict(batch_size=4, seed=3, workers=2, order="quasi-random", order_window=2)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", product_pipelines())
def test_every_pipeline_yields_the_quasi_random_batches(name, photo_path):
    """Labels are sample indices: each pipeline yields exactly the order's batches, on two
    ranks, disjoint and each from its own shards; a resumed pass yields the tail; the split is
    told which shards come next."""
    from turbotrain.datasets import open_dataset
    bounds = [0, 6, 13, 20, 24, 31, 40]  # 6 uneven shards of the 40 photos
    per_rank = []
    for rank in range(2):
        view = ShardedView(open_dataset(photo_path), bounds)
        opts = dict(QUASI, train=True, image_size=32, rank=rank, world_size=2)
        expected = quasi(bounds, rank=rank, world=2, batch=4, seed=3).batches(1)
        with build(name, view, **opts) as pipeline:
            got = [labels.tolist() for _, labels in run_epoch(pipeline, epoch=1)]
        assert got == [b.tolist() for b in expected]
        own = quasi(bounds, rank=rank, world=2, batch=4, seed=3).pieces(1)[0].tolist()
        if name != "resident":  # resident read the split when built
            assert view.hints == [shards_in_order(bounds, np.concatenate(expected))]
            assert sorted(view.hints[0]) == sorted(own)  # its own shards, nothing else
        per_rank.append(np.concatenate(got))
        with build(name, view, **opts) as pipeline:
            run_epoch(pipeline, epoch=1, limit=2)
            state = pipeline.state_dict()
        with build(name, view, **opts) as resumed:
            resumed.load_state_dict(state)
            tail = [labels.tolist() for _, labels in resumed]
        assert tail == got[2:]
        if name != "resident":
            assert view.hints[-1] == shards_in_order(bounds, np.concatenate(expected[2:]))
    assert not set(per_rank[0].tolist()) & set(per_rank[1].tolist())


def test_an_unsharded_split_is_cut_into_virtual_blocks(photo_path, monkeypatch):
    from turbotrain.datasets import open_dataset
    from turbotrain.pipeline import order as order_module
    dataset = open_dataset(photo_path)
    monkeypatch.setattr(order_module, "VIRTUAL_BLOCK_BYTES", dataset.beton.file_size // 5)
    with build("pytorch", dataset, **QUASI, train=True, image_size=32) as pipeline:
        assert pipeline.order.bounds.tolist() == [0, 8, 16, 24, 32, 40]
        got = [labels.tolist() for _, labels in run_epoch(pipeline, epoch=2)]
    assert got == [b.tolist() for b in quasi([0, 8, 16, 24, 32, 40], batch=4, seed=3)
                   .batches(2)]


@pytest.fixture(scope="module")
def sharded_path(tmp_path_factory):
    """A real sharded split: 2,100 raw 64 px images prepared with --shard-size 8MiB (the
    smallest allowed), which gives 4 shards."""
    from turbotrain.cli import main
    folder = tmp_path_factory.mktemp("sharded")
    rng = np.random.default_rng(0)
    np.savez(folder / "d.npz", images=rng.integers(0, 256, (2100, 64, 64, 3), dtype=np.uint8),
             labels=np.arange(2100) % 4)
    assert main(["prepare", str(folder / "d.npz"), str(folder / "out"), "--shard-size",
                 "8MiB"]) == 0
    return folder / "out"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", product_pipelines())
def test_a_sharded_split_is_read_shard_by_shard(name, sharded_path):
    """Each rank reads only the shards of its stretch, tells the split which in order, and
    yields the quasi-random order's batches (checked by the stored pixels of each sample).
    FFCV's Loader reads one .beton: `ffcv` refuses a sharded split, in one line."""
    from turbotrain.datasets import open_dataset
    from turbotrain.datasets.prepare.split_order import shuffled_order
    if name == "ffcv":
        with pytest.raises(PipelineUnavailable, match="stored in 4 shards"):
            build_pipeline(name, open_dataset(sharded_path), train=True, batch_size=8,
                           image_size=64, device="cpu", order="quasi-random")
        return
    per_rank = []
    for rank in range(2):
        dataset = open_dataset(sharded_path)
        # stored shuffled (sources.shuffled_train): sample i is source sample order[i]
        order = shuffled_order(2100)
        assert dataset.labels.tolist() == (order % 4).tolist()
        assert dataset.num_shards == 4 and block_bounds(dataset).tolist() == \
            dataset.shard_bounds.tolist()
        hints = []
        dataset.will_read = hints.append
        opts = dict(train=True, batch_size=64, image_size=64, seed=5, workers=2, rank=rank,
                    world_size=2, order="quasi-random", order_window=2)
        expected = quasi(dataset.shard_bounds, rank=rank, world=2, batch=64, seed=5,
                         window=2).batches(0)
        with build(name, dataset, **opts) as pipeline:
            got = run_epoch(pipeline, epoch=0, limit=3)
        samples = np.concatenate(expected)
        if name != "resident":
            assert hints == [shards_in_order(dataset.shard_bounds, samples)]
            assert len(hints[0]) <= 3  # 4 shards, 2 ranks: 2 each, + 1 shared at the seam
        for (images, labels), indices in zip(got, expected):
            assert labels.tolist() == dataset.labels[indices].tolist()
            # pad-crop keeps the centre 56 x 56 of each 64 px image's pixels, shifted by <= 4
            # px: the mean of the whole image tells the samples apart well enough here.
            stored = np.stack([dataset.image(i) for i in indices]).astype(np.float32)
            assert np.abs(images.float().mean((1, 2, 3)).numpy()
                          - stored.mean((1, 2, 3))).max() < 3
        per_rank.append(set(samples.tolist()))
    assert not per_rank[0] & per_rank[1]
