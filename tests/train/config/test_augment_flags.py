"""timm's augmentation flags (--aa, --color-jitter, --reprob, --remode, --recount): parsed,
checked in one line, saved, recorded by the plan and summary.json, passed to the training
pipeline only, and applied by a real run."""
from __future__ import annotations

import argparse
import json

import pytest

from turbotrain.augment_policy import AugmentError, parse_aa, policy
from turbotrain.pipeline import PipelineError
from turbotrain.train.config.config import TrainConfig
from turbotrain.train.config.config_files import config_from_namespace, load_yaml, save_yaml
from turbotrain.train.config.config_flags import add_config_arguments
from turbotrain.train.engine.loader import pipeline_options
from turbotrain.train.errors import TrainError
from turbotrain.train.plan import PRESETS, plan
from turbotrain.train.plan.augment_rule import OFF_REASON
from turbotrain.train.step.distributed import DistEnv

from ..plan.test_plan import PHOTOS

TIMM = ["--aa", "rand-m9-mstd0.5", "--reprob", "0.25", "--remode", "const", "--recount", "2",
        "--color-jitter", "0.4"]


def parse(*argv):
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, pipeline_choices=["pytorch"])
    return config_from_namespace(parser.parse_args(["--data", "d", *map(str, argv)]))


def test_timms_flags_read_into_one_policy():
    config = parse(*TIMM)
    config.validate()
    assert (config.aa, config.reprob, config.remode, config.recount,
            config.color_jitter) == ("rand-m9-mstd0.5", 0.25, "const", 2, 0.4)
    got = config.augment_policy()
    assert got.aa.magnitude == 9 and got.aa.magnitude_std == 0.5 and got.aa.layers == 2
    assert not got.jitters  # timm drops colour jitter under --aa
    assert parse("--aa", "trivial").augment_policy().aa.layers == 1
    assert not parse().augment_policy().enabled  # all off by default


@pytest.mark.parametrize("text, spec", [
    ("rand-m9-mstd0.5", (9, 2, 0.5, 10, False)), ("rand-m7-n3-mmax12-inc1", (7, 3, 0, 12, True)),
    ("rand-mstd101", (10, 2, float("inf"), 10, False)), ("RAND-M9", (9, 2, 0, 10, False))])
def test_aa_strings_parse_as_timm_reads_them(text, spec):
    aa = parse_aa(text)
    assert (aa.magnitude, aa.layers, aa.magnitude_std, aa.magnitude_max, aa.increasing) == spec
    assert parse_aa("none") is None and parse_aa(None) is None


@pytest.mark.parametrize("argv, message", [
    (["--aa", "original"], "--aa original: takes rand-m9-mstd0.5"),
    (["--aa", "rand-m9-w0"], "--aa rand-m9-w0: unknown section 'w0'"),
    (["--aa", "rand-n0"], "--aa rand-n0: n (ops per image)"),
    (["--reprob", "1.5"], "--reprob 1.5: must be in [0, 1]"),
    (["--recount", "0"], "--recount 0: must be a whole number"),
    (["--color-jitter", "-0.1"], "--color-jitter -0.1: must be in [0, 1]"),
])
def test_bad_values_are_one_line_errors(argv, message):
    with pytest.raises(TrainError) as error:
        parse(*argv).validate()
    assert str(error.value).startswith(message) and "\n" not in str(error.value)
    with pytest.raises(SystemExit):  # --remode is a choice argparse refuses
        parse("--remode", "noise")
    with pytest.raises(AugmentError):
        policy(recount=True)


def test_a_bad_flag_ends_train_with_one_line(train_cli, tiny_dataset, tmp_path):
    code, _, err = train_cli("--data", tiny_dataset, "--out", tmp_path / "run", "--aa",
                             "rand-m9-bogus1")
    assert code != 0 and "--aa rand-m9-bogus1: unknown section 'bogus1'" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_the_saved_config_keeps_them(tmp_path):
    config = parse(*TIMM)
    save_yaml(config, tmp_path / "config.yaml")
    loaded = TrainConfig(**load_yaml(tmp_path / "config.yaml"))
    assert loaded.augment_policy() == config.augment_policy()


def test_the_plan_records_the_policy_and_says_what_is_off():
    cpu = PRESETS["cpu2"]
    off = plan(TrainConfig(data="d"), PHOTOS, cpu)["augment"]
    assert (off.value, off.reason, off.shown) == ("off", OFF_REASON, False)
    on = plan(TrainConfig(data="d", aa="trivial", reprob=0.25), PHOTOS, cpu)
    assert on["augment"].shown and on["augment"].value.startswith("TrivialAugment")
    assert "random erasing p=0.25" in on.lines["augment"]
    assert "after decode" in on["augment"].reason
    both = plan(TrainConfig(data="d", aa="rand-m9", color_jitter=0.4), PHOTOS, cpu)["augment"]
    assert "--color-jitter 0.4 not applied" in both.reason
    jitter = plan(TrainConfig(data="d", color_jitter=0.4), PHOTOS, cpu)["augment"]
    assert jitter.value.startswith("colour jitter 0.4")


def test_only_the_training_pipeline_gets_them():
    planned = plan(TrainConfig(data="d", aa="trivial", batch_size=8), PHOTOS, PRESETS["cpu2"])
    env = DistEnv(rank=0, world_size=1, local_rank=0)
    assert pipeline_options(planned, env, train=True).augment.aa.kind == "trivial"
    assert pipeline_options(planned, env, train=False).augment is None


def test_a_pipeline_that_cannot_apply_them_refuses(tiny_dataset):
    from turbotrain.datasets import open_dataset
    from turbotrain.pipeline import build_pipeline
    with pytest.raises(PipelineError, match="does not apply --aa"):
        build_pipeline("test-memory", open_dataset(str(tiny_dataset)), train=True, batch_size=8,
                       image_size=16, device="cpu", augment=policy(reprob=0.5))


def test_a_run_applies_and_reports_them(train_cli, tiny_dataset, tmp_path):
    out = tmp_path / "run"
    code, stdout, err = train_cli("--data", tiny_dataset, "--out", out, "--epochs", 1,
                                  "--batch-size", 16, "--threads", 1, "--workers", 0,
                                  "--pipeline", "resident", "--no-tta", *TIMM)
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["augment"].startswith("RandAugment (2 ops per image")
    assert "random erasing p=0.25, 1-2 boxes, const fill" in summary["decisions"]["augment"]
    assert "RandAugment" in stdout + err


def test_the_loader_takes_them_with_one_line_errors(tiny_dataset):
    from turbotrain import Loader, LoaderError
    cpu = dict(device="cpu", workers=1, threads=1, batch_size=16, image_size=16,
               pipeline="resident")
    with pytest.raises(LoaderError) as error:
        Loader(tiny_dataset, **cpu, reprob=2.0)
    assert str(error.value).startswith("Loader(reprob=2.0): must be in [0, 1]")
    with Loader(tiny_dataset, **cpu) as plain, \
            Loader(tiny_dataset, **cpu, aa="rand-m9-mstd0.5", reprob=0.5) as augmented:
        assert "RandAugment" in augmented.decisions["augment"]
        (clean, labels), (changed, same_labels) = next(iter(plain)), next(iter(augmented))
    assert labels.equal(same_labels) and not clean.equal(changed)


def test_a_val_loader_and_lightnings_module_take_them_too(tiny_dataset):
    from turbotrain import Loader, LoaderError
    from turbotrain.lightning import TurbotrainDataModule
    with Loader(tiny_dataset, "val", device="cpu", workers=1, threads=1, batch_size=8,
                image_size=16, pipeline="resident", aa="trivial") as val:
        assert "augment" not in val.decisions  # evaluation is never augmented
        assert val.pipeline.after_decode is None
    with pytest.raises(LoaderError, match=r"^Loader\(aa='rand-x1'\): unknown section 'x1'"):
        TurbotrainDataModule(tiny_dataset, batch_size=8, aa="rand-x1")
    module = TurbotrainDataModule(tiny_dataset, batch_size=8, reprob=0.25, remode="rand")
    assert (module.options["reprob"], module.options["remode"]) == (0.25, "rand")


def test_on_a_gpu_the_batch_search_reserves_the_stage_s_work_memory():
    """The stage's float copies and sampling grid (~20 bytes a pixel) live beside the step on
    the GPU: the batch search keeps room for them at the largest batch it may keep."""
    from turbotrain.train.plan.augment_rule import work_bytes
    gpu = PRESETS["h200"]
    plain = plan(TrainConfig(data="d"), PHOTOS, gpu).batch_search
    augmented = plan(TrainConfig(data="d", aa="trivial"), PHOTOS, gpu).batch_search
    size = plan(TrainConfig(data="d"), PHOTOS, gpu).config.image_size
    assert augmented.reserve_bytes - plain.reserve_bytes == work_bytes(augmented.bound, size)
    assert work_bytes(256, 224) == pytest.approx(250e6, rel=0.05)
    cpu = PRESETS["cpu2"]  # on a CPU the stage's memory is host memory, not the search's
    assert (plan(TrainConfig(data="d", aa="trivial"), PHOTOS, cpu).batch_search.reserve_bytes
            == plan(TrainConfig(data="d"), PHOTOS, cpu).batch_search.reserve_bytes)
