"""TrainConfig: flags generated from the dataclass, YAML under flags, saved config reloads."""
from __future__ import annotations

import argparse

import pytest

from turbotrain.train.config.config import FIELDS, TrainConfig
from turbotrain.train.config.config_files import config_from_namespace, load_yaml, save_yaml
from turbotrain.train.config.config_flags import add_config_arguments
from turbotrain.train.errors import TrainError


def parse(*argv):
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, pipeline_choices=["pytorch"])
    return parser.parse_args([str(a) for a in argv])


def test_every_field_has_a_flag_and_only_given_flags_are_set():
    args = parse("--data", "d", "--batch-size", "64", "--no-ema", "--image-size", "auto")
    assert vars(args) == {"data": "d", "batch_size": 64, "ema": False, "image_size": None}
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    flags = {a.dest for a in parser._actions if a.dest != "help"}
    assert flags == set(FIELDS)


def test_on_off_flags_use_boolean_optional_action():
    assert parse("--compile").compile is True and parse("--no-compile").compile is False
    assert parse("--channels-last").channels_last is True


def test_bad_values_are_refused_by_argparse():
    for argv in (["--batch-size", "x"], ["--precision", "fp8"], ["--pipeline", "nope"]):
        with pytest.raises(SystemExit):
            parse(*argv)


def test_layering_defaults_yaml_flags(tmp_path):
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("data: from-yaml\nepochs: 3\nlr: 0.5\nema: true\nimage_size: auto\n")
    config = config_from_namespace(parse("--config", yaml_file, "--lr", "0.1"))
    assert config.data == "from-yaml" and config.epochs == 3 and config.ema is True
    assert config.lr == 0.1  # the flag wins
    assert config.image_size is None and config.optimizer == "sgd"  # auto / default


def test_saved_config_round_trips_and_resume_reads_it(tmp_path):
    config = TrainConfig(data="d", model="resnet9", batch_size=32, lr=0.2, image_size=32,
                         out=str(tmp_path), resume=True, config="x.yaml")
    save_yaml(config, tmp_path / "config.yaml")
    loaded = load_yaml(tmp_path / "config.yaml")
    assert "resume" not in loaded and "config" not in loaded
    assert TrainConfig(**loaded) == config.replace(resume=False, config=None)
    resumed = config_from_namespace(parse("--out", tmp_path, "--resume", "--epochs", "20"))
    assert resumed.model == "resnet9" and resumed.batch_size == 32 and resumed.epochs == 20
    assert resumed.resume is True


def test_a_run_saved_before_order_existed_resumes_in_random_order(tmp_path):
    config = TrainConfig(data="d", model="resnet9", batch_size=32, out=str(tmp_path),
                         order="quasi-random")
    save_yaml(config, tmp_path / "config.yaml")
    assert load_yaml(tmp_path / "config.yaml")["order"] == "quasi-random"
    assert config_from_namespace(parse("--out", tmp_path, "--resume")).order == "quasi-random"
    text = (tmp_path / "config.yaml").read_text()
    (tmp_path / "config.yaml").write_text(
        "".join(line for line in text.splitlines(True) if not line.startswith("order:")))
    assert config_from_namespace(parse("--out", tmp_path, "--resume")).order == "random"
    assert config_from_namespace(parse("--data", "d")).order == "auto"  # a new run decides


@pytest.mark.parametrize("text, message", [
    ("bogus: 1\n", "unknown setting 'bogus'"),
    ("epochs: many\n", "--epochs: expected int"),
    ("optimizer: lamb\n", "--optimizer: 'lamb' is not one of"),
    ("- a\n- b\n", "must be a mapping"),
    ("a: [\n", "not valid YAML"),
])
def test_yaml_errors_are_one_line(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(TrainError, match=message.replace("[", r"\[")) as exc:
        load_yaml(path)
    assert "\n" not in str(exc.value)


def test_data_is_required_and_resume_needs_out():
    with pytest.raises(TrainError, match="--data is required"):
        config_from_namespace(parse())
    with pytest.raises(TrainError, match="--resume needs --out"):
        config_from_namespace(parse("--resume"))


def test_warmup_in_epochs_or_steps_is_one_setting(tmp_path):
    """--warmup-epochs (timm's unit) and --warmup-steps set the same warm-up: both given is an
    error; a layer that sets one drops the other from the layers below (a run saved with its
    steps resumes under a --warmup-epochs flag, a YAML file's steps give way to the flag)."""
    with pytest.raises(TrainError, match="--warmup-steps and --warmup-epochs both set the "
                                         "warm-up; give one"):
        config_from_namespace(parse("--data", "d", "--warmup-steps", 5, "--warmup-epochs", 1))
    with pytest.raises(TrainError, match="--warmup-epochs must be a number >= 0"):
        config_from_namespace(parse("--data", "d", "--warmup-epochs", -1))
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("data: d\nwarmup-steps: 7\n")
    config = config_from_namespace(parse("--config", yaml_file, "--warmup-epochs", 2))
    assert (config.warmup_steps, config.warmup_epochs) == (None, 2.0)
    save_yaml(TrainConfig(data="d", out=str(tmp_path), warmup_steps=30), tmp_path / "config.yaml")
    resumed = config_from_namespace(parse("--out", tmp_path, "--resume", "--warmup-epochs", 1))
    assert (resumed.warmup_steps, resumed.warmup_epochs) == (None, 1.0)


def test_the_image_size_help_and_the_readme_state_the_plans_rule():
    """`--image-size auto` as plan/rules.py decides it: the native size of small raw images,
    else 64 px on a CPU and on CUDA below SMALL_SET train images, else 224 (the README once
    said the first and --help the second, which left out the small-set rule). The flag table
    is in docs/TRAINING.md since the README was shortened (issue 46)."""
    from pathlib import Path

    from turbotrain.datasets.beton.layout import SMALL_IMAGE_MAX_SIDE
    from turbotrain.train.plan.budget_size import CANDIDATES
    from turbotrain.train.plan.rules import SHORT_RUN_SIZE, SMALL_SET
    text = FIELDS["image_size"].metadata["help"]
    for number in (f"<= {SMALL_IMAGE_MAX_SIDE} px", f"else {SHORT_RUN_SIZE} on CPU",
                   f"fewer than {SMALL_SET:,} train images", "else 224"):
        assert number in text, number
    page = (Path(__file__).resolve().parents[3] / "docs" / "TRAINING.md").read_text()
    row = next(line for line in page.splitlines() if line.startswith("| `--image-size` |"))
    for number in (f"{SHORT_RUN_SIZE} on CPU", f"fewer than {SMALL_SET:,} train images",
                   "else 224"):
        assert number in row, number
    # --time-budget on a CPU picks the size among budget_size's candidates: both say so.
    sizes = sorted({c.image_size for c in CANDIDATES}, reverse=True)
    said = " or ".join(map(str, sizes)) + ", as the budget allows"
    assert f"with --time-budget on a CPU (and --model auto), {said}" in text
    assert f"with `--time-budget` on a CPU (and `--model auto`), {said}" in row


def test_epochs_given_on_resume_are_trained_whole(tmp_path):
    """A run saved with the automatic early stop: a new --epochs is the length the user wants,
    without the stop; resumed as it was, it keeps it."""
    save_yaml(TrainConfig(data="d", epochs=10, early_stop=True), tmp_path / "config.yaml")
    assert config_from_namespace(parse("--out", tmp_path, "--resume")).early_stop is True
    longer = config_from_namespace(parse("--out", tmp_path, "--resume", "--epochs", 20))
    assert longer.epochs == 20 and longer.early_stop is None  # the plan: --epochs given, off
    both = config_from_namespace(parse("--out", tmp_path, "--resume", "--epochs", 20,
                                       "--early-stop"))
    assert both.early_stop is True
    assert config_from_namespace(parse("--data", "d")).epochs is None  # not given: the plan's
