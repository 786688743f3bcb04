"""turbotrain.Loader: the pipelines in a user's own loop (train/engine/loader.py)."""
from __future__ import annotations

import itertools
import subprocess
import sys
import textwrap

import pytest
import torch

from turbotrain import Loader, LoaderError
from turbotrain.datasets import open_dataset
from turbotrain.pipeline import build_pipeline
from turbotrain.train.engine import builder
from turbotrain.train.engine.loader import Loader as LoaderClass

from ..conftest import REPO
from ..tiny_data import write_tiny_dataset

pytestmark = pytest.mark.usefixtures("child_processes")  # not in make test-fast

CPU = dict(device="cpu", workers=1, threads=1)


def batches(loader, limit=None):
    return [(images.clone(), labels.clone())
            for images, labels in itertools.islice(loader, limit)]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_tiny_dataset(tmp_path_factory.mktemp("loader") / "ds", train=96, val=40)


@pytest.mark.parametrize("pipeline", ["pytorch", "resident"])
def test_batches_are_the_pipelines_own(data, pipeline):
    """The Loader adds nothing: the same batches as the pipeline built directly."""
    with Loader(data, batch_size=16, image_size=16, pipeline=pipeline, **CPU) as loader:
        loader.set_epoch(1)
        got = batches(loader)
    direct = build_pipeline(pipeline, open_dataset(str(data), split="train"), train=True,
                            batch_size=16, image_size=16, device=torch.device("cpu"),
                            workers=1, order="random")
    direct.set_epoch(1)
    want = batches(direct)
    direct.close()
    assert len(got) == len(want) == 6
    for (a, la), (b, lb) in zip(got, want):
        assert a.dtype == torch.uint8 and a.shape == (16, 3, 16, 16)
        assert a.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(a, b) and torch.equal(la, lb)


def test_auto_says_why_and_the_plan_is_readable(data):
    with Loader(data, batch_size=16, **CPU) as loader:
        assert loader.pipeline_name in ("resident", "pytorch", "dali", "ffcv")
        assert loader.decisions["pipeline"].startswith(loader.pipeline_name + ": ")
        assert "image_size" in loader.decisions and loader.image_size == 16
        assert "threads" in loader.decisions
        assert loader.workers >= 0 and loader.torch_threads >= 1
        assert loader.device == torch.device("cpu")
        assert len(loader) == 96 // 16
        assert loader.num_classes == 4 and loader.class_names[0] == "class0"
        assert "Loader(" in repr(loader)


def test_normalize_uses_the_dataset_stats_in_the_asked_dtype(data):
    kwargs = dict(batch_size=8, image_size=16, pipeline="pytorch", train=False, **CPU)
    with Loader(data, "val", **kwargs) as raw, \
            Loader(data, "val", normalize=True, dtype=torch.bfloat16, **kwargs) as norm:
        (raw_images, _), = batches(raw, limit=1)
        (images, _), = batches(norm, limit=1)
    assert images.dtype == torch.bfloat16 and images.shape == raw_images.shape
    assert images.is_contiguous(memory_format=torch.channels_last)
    want = (raw_images.float() - 70.0) / 60.0  # tiny_data's pixel_stats
    assert torch.allclose(images.float(), want, atol=0.02)


def test_eval_split_keeps_every_image_in_order(data):
    with Loader(data, "val", batch_size=16, pipeline="pytorch", **CPU) as loader:
        got = batches(loader)
    labels = torch.cat([lab for _, lab in got])
    assert [len(lab) for _, lab in got] == [16, 16, 8]  # not shuffled, last batch kept
    assert labels.tolist() == list(open_dataset(str(data), split="val").labels)


def test_state_dict_resumes_mid_epoch_exactly(data):
    kwargs = dict(batch_size=8, image_size=16, pipeline="pytorch", **CPU)
    with Loader(data, **kwargs) as loader:
        loader.set_epoch(3)
        whole = batches(loader)
    with Loader(data, **kwargs) as loader:
        loader.set_epoch(3)
        first = batches(loader, limit=5)  # a decode-ahead pipeline has read further
        state = loader.state_dict()
    assert state["epoch"] == 3 and state["batch_index"] == 5
    with Loader(data, **kwargs) as resumed:
        resumed.set_epoch(3)
        resumed.load_state_dict(state)
        rest = batches(resumed)
    assert len(first) + len(rest) == len(whole) == 12
    for (a, la), (b, lb) in zip(first + rest, whole):
        assert torch.equal(a, b) and torch.equal(la, lb)


def labels_of(passed) -> list[int]:
    return torch.cat([lab for _, lab in passed]).tolist()


def direct_epoch(data, epoch: int) -> list[int]:
    """The labels of `epoch` straight from the pipeline (the reference order)."""
    pipeline = build_pipeline("pytorch", open_dataset(str(data), split="train"), train=True,
                              batch_size=8, image_size=16, device=torch.device("cpu"),
                              workers=1, order="random")
    pipeline.set_epoch(epoch)
    try:
        return labels_of(batches(pipeline))
    finally:
        pipeline.close()


def test_passes_without_set_epoch_are_the_next_epochs(data):
    """As a DataLoader reshuffles on each pass: pass k is epoch k, with its own order."""
    with Loader(data, batch_size=8, image_size=16, pipeline="pytorch", **CPU) as loader:
        passes = [labels_of(batches(loader)) for _ in range(3)]
        assert loader.epoch == 2
    assert passes == [direct_epoch(data, e) for e in range(3)]
    assert passes[0] != passes[1] != passes[2]


def test_a_peek_does_not_shorten_the_next_pass(data):
    with Loader(data, batch_size=8, image_size=16, pipeline="pytorch", **CPU) as loader:
        peeked = iter(loader)
        next(peeked)
        whole = batches(loader)  # a new pass: from its first batch, the peek's iterator ended
        assert len(whole) == len(loader) == 12
        assert labels_of(whole) == direct_epoch(data, 1)
        with pytest.raises(StopIteration):
            next(peeked)


def test_set_epoch_rules_the_passes_after_it(data):
    with Loader(data, batch_size=8, image_size=16, pipeline="pytorch", **CPU) as loader:
        loader.set_epoch(5)
        first = labels_of(batches(loader, limit=3))
        loader.set_epoch(5)  # the same epoch again: from its first batch
        again = labels_of(batches(loader))
        after = labels_of(batches(loader))  # no set_epoch: the next epoch
    assert again == direct_epoch(data, 5) and first == again[:24]
    assert after == direct_epoch(data, 6)


@pytest.mark.parametrize("saved_at", [5, 12])
def test_a_restored_loader_continues_then_goes_on_to_the_next_epoch(data, saved_at):
    """Mid-epoch: the rest of the saved epoch, then the next; a complete epoch: the next."""
    kwargs = dict(batch_size=8, image_size=16, pipeline="pytorch", **CPU)
    with Loader(data, **kwargs) as loader:
        loader.set_epoch(3)
        batches(loader, limit=saved_at)
        state = loader.state_dict()
    want = direct_epoch(data, 3)
    with Loader(data, **kwargs) as resumed:
        resumed.load_state_dict(state)
        rest = labels_of(batches(resumed)) if saved_at < 12 else []
        following = labels_of(batches(resumed))
    assert rest == want[saved_at * 8:]
    assert following == direct_epoch(data, 4)


def test_the_trainers_calls_keep_their_meaning(data):
    """`train` names every epoch (set_epoch), rewinds after airbench's data_init peek
    (builder._data_init) and resumes with set_epoch then load_state_dict (trainer.py); every
    evaluation restores the position it started from (loop.evaluate): none of it depends on
    the passes' own counting."""
    kwargs = dict(batch_size=8, image_size=16, pipeline="pytorch", **CPU)
    with Loader(data, **kwargs) as loader:
        loader.set_epoch(0)  # builder._data_init
        start = loader.state_dict()
        iterator = iter(loader)
        next(iterator)
        del iterator
        loader.load_state_dict(start)
        epochs = []
        for epoch in range(2):  # trainer._train_epoch
            loader.set_epoch(epoch)
            epochs.append(labels_of(batches(loader)))
        loader.set_epoch(2)
        partial = labels_of(batches(loader, limit=4))
        saved = {**loader.state_dict(), "epoch": 2, "batch_index": 4}  # trainer_state
    with Loader(data, **kwargs) as resumed:
        resumed.load_state_dict(saved)  # restore_state checks it early
        resumed.set_epoch(2)
        resumed.load_state_dict(saved)
        rest = labels_of(batches(resumed))
    assert epochs == [direct_epoch(data, 0), direct_epoch(data, 1)]
    assert partial + rest == direct_epoch(data, 2)
    with Loader(data, "val", batch_size=16, pipeline="pytorch", **CPU) as val:
        passes = []
        for _ in range(3):  # loop.evaluate
            initial = val.state_dict()
            passes.append(labels_of(batches(val)))
            val.load_state_dict(initial)
    assert passes[0] == passes[1] == passes[2] and len(passes[0]) == 40


def test_classes_is_class_names(data):
    with Loader(data, batch_size=8, pipeline="pytorch", **CPU) as loader:
        assert loader.classes == loader.class_names == open_dataset(str(data)).class_names


def test_rank_and_world_size_split_the_epoch(data):
    seen = []
    for rank in (0, 1):
        with Loader(data, batch_size=8, pipeline="pytorch", rank=rank, world_size=2,
                    **CPU) as loader:
            assert len(loader) == 96 // 2 // 8
            seen.append(torch.cat([lab for _, lab in batches(loader)]))
    assert len(seen[0]) == len(seen[1]) == 48


def test_process_group_gives_rank_and_world_size(data, tmp_path):
    """Under torch.distributed (2 CPU processes, gloo) each rank reads its own half."""
    script = tmp_path / "ranks.py"
    script.write_text(textwrap.dedent(f"""
        import torch, torch.distributed as dist
        from turbotrain import Loader
        dist.init_process_group("gloo")
        with Loader({str(data)!r}, batch_size=8, pipeline="pytorch", device="cpu",
                    workers=1, threads=1) as loader:
            labels = torch.cat([lab for _, lab in loader])
        sizes = [None, None]
        dist.all_gather_object(sizes, (dist.get_rank(), len(loader), labels.tolist()))
        if dist.get_rank() == 0:
            print("RESULT", sizes)
        dist.destroy_process_group()
        """))
    # --standalone: a private rendezvous on a free port.
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                             "--nproc-per-node", "2", str(script)], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    line = next(x for x in result.stdout.splitlines() if x.startswith("RESULT"))
    (r0, n0, l0), (r1, n1, l1) = eval(line[len("RESULT "):])
    assert (r0, r1) == (0, 1) and n0 == n1 == 6 and len(l0) == len(l1) == 48


def test_process_group_contradicting_rank_is_one_line(data, monkeypatch):
    import torch.distributed as dist
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda: 0)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    with pytest.raises(LoaderError, match=r"world_size=4.*process group says 2"):
        Loader(data, batch_size=8, world_size=4, **CPU)


@pytest.mark.parametrize("kwargs, named", [
    (dict(batch_size=0), "batch_size=0"),
    (dict(batch_size=True), "batch_size=True"),
    (dict(image_size=4), "image_size=4"),
    (dict(device="tpu"), "device='tpu'"),
    (dict(pipeline="fast"), "pipeline='fast'"),
    (dict(dtype=torch.float16), "dtype=torch.float16"),
    (dict(normalize=True, dtype=torch.int32), "dtype=torch.int32"),
    (dict(order="sorted"), "order='sorted'"),
    (dict(workers=-1), "workers=-1"),
    (dict(rank=2, world_size=2), "rank=2, world_size=2"),
    (dict(scale=(0.5,)), "scale=(0.5,)"),
    (dict(split=""), "split=''"),
])
def test_bad_arguments_are_one_line_naming_the_argument(data, kwargs, named):
    with pytest.raises(LoaderError) as error:
        Loader(data, **{**CPU, **kwargs})
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"Loader({named})")


def test_missing_data_and_split_are_one_line(data, tmp_path):
    from turbotrain.datasets import DatasetError
    with pytest.raises(DatasetError) as error:
        Loader(tmp_path / "nowhere", batch_size=8, **CPU)
    assert "\n" not in str(error.value) and "nowhere" in str(error.value)
    with pytest.raises(DatasetError) as error:
        Loader(data, "test", batch_size=8, **CPU)
    assert "\n" not in str(error.value) and "test" in str(error.value)


def test_bad_state_is_one_line(data):
    with Loader(data, batch_size=8, pipeline="pytorch", **CPU) as loader:
        for state, why in (({"epoch": 0, "batch_index": 99}, "past"),
                           ({"epoch": -1, "batch_index": 0}, "'epoch'"),
                           ([1, 2], "needs the dict")):
            with pytest.raises(LoaderError, match=why):
                loader.load_state_dict(state)


def test_close_twice_and_iterating_closed(data):
    loader = Loader(data, batch_size=8, pipeline="pytorch", **CPU)
    loader.close()
    loader.close()
    with pytest.raises(LoaderError, match="closed"):
        next(iter(loader))


def test_train_iterates_a_loader(data, tmp_path, monkeypatch):
    """`train` builds its batches through the same Loader class."""
    made = []
    original = LoaderClass.opened.__func__

    def spy(cls, *args):
        loader = original(cls, *args)
        made.append(loader)
        return loader
    monkeypatch.setattr(LoaderClass, "opened", classmethod(spy))
    from turbotrain.cli import main
    code = main(["train", "--data", str(data), "--out", str(tmp_path / "run"), "--epochs", "1",
                 "--batch-size", "16", "--pipeline", "pytorch", "--threads", "1",
                 "--workers", "1", "--log-every", "1"])
    assert code == 0
    assert len(made) == 2 and all(isinstance(x, LoaderClass) for x in made)  # train + val
    assert builder.Loader is LoaderClass
