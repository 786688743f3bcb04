"""`Loader(min_res=..., res_ramp=...)`: progressive resizing in a user's own loop (and under
Lightning, whose EpochLoader calls set_epoch): each epoch's batches at the schedule's size."""
from __future__ import annotations

import pytest

from turbotrain.train.engine.loader import Loader, LoaderError
from turbotrain.train.errors import TrainError

from ..tiny_data import write_tiny_dataset


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return write_tiny_dataset(tmp_path_factory.mktemp("photos72") / "ds", size=72)


def test_each_epoch_at_its_size(photos):
    loader = Loader(photos, batch_size=8, image_size=32, pipeline="pytorch", workers=1,
                    min_res=16, res_ramp=(1, 2))
    try:
        for epoch, size in ((0, 16), (1, 16), (2, 32), (5, 32)):
            loader.set_epoch(epoch)
            images, _ = next(iter(loader))
            assert images.shape[1:] == (3, size, size) and loader.size_at(epoch) == size
    finally:
        loader.close()
    val = Loader(photos, "val", batch_size=8, image_size=32, pipeline="pytorch", workers=1,
                 min_res=16, res_ramp=(1, 2))
    try:
        assert next(iter(val))[0].shape[1:] == (3, 32, 32)  # evaluation: the image size
    finally:
        val.close()


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(min_res=16), LoaderError, "needs both min_res and res_ramp"),
    (dict(res_ramp=(1, 2)), LoaderError, "needs both min_res and res_ramp"),
    (dict(min_res=16, res_ramp=(3, 1)), LoaderError, "0 <= START <= END"),
    (dict(min_res=64, res_ramp=(1, 2)), TrainError, "min_res 64 is above the image size 32"),
])
def test_bad_schedules_are_one_line(photos, kwargs, error, message):
    with pytest.raises(error, match=message):
        Loader(photos, batch_size=8, image_size=32, pipeline="pytorch", **kwargs)
