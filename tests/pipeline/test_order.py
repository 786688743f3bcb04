"""order.py: one permutation per (seed, epoch), equal disjoint shards, clear drop_last."""
from __future__ import annotations

import numpy as np
import pytest

from turbotrain.pipeline.order import SampleOrder, epoch_permutation, num_batches


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
