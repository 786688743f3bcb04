"""Test-time resolution and flip TTA from a run to `eval` and `predict`: the run evaluates at the
plan's eval_res with TTA, its weights card says so, `eval` repeats the logged accuracy that way
and `--eval-res` / `--no-tta` change it; bad values are one line."""
from __future__ import annotations

import json

import pytest
import torch

from tests.train.tiny_data import write_tiny_dataset
from turbotrain.train.config.config import TrainConfig
from turbotrain.train.engine.loader import pipeline_options
from turbotrain.train.plan import PRESETS, plan
from turbotrain.train.step.distributed import DistEnv
from turbotrain.train.weights.weights import BEST_NAME, read_weights

from ..plan.test_plan import PHOTOS

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("child_processes")]

# 96 px pictures (above the small-image limit: random-resized crops), trained at 48 px:
# evaluated at 1.3 x 48 = 62.4 -> 64 px.
# With --blurpool: the card must say so, for eval to rebuild the net that logged the accuracy.
RUN = ["--image-size", "48", "--model", "compact28", "--epochs", "1", "--batch-size", "32",
       "--threads", "1", "--workers", "1", "--pipeline", "pytorch", "--log-every", "1",
       "--blurpool"]


@pytest.fixture(scope="module")
def photo_run(tmp_path_factory):
    from turbotrain.cli import main
    root = tmp_path_factory.mktemp("evalres")
    data = write_tiny_dataset(root / "ds", train=128, val=64, size=96)
    assert main(["train", "--data", str(data), "--out", str(root / "run"), *RUN]) == 0
    return data, root / "run"


def test_the_eval_pipeline_gets_the_eval_size():
    p = plan(TrainConfig(data="DATA"), PHOTOS, PRESETS["h200"])
    assert pipeline_options(p, DistEnv(), train=False).image_size == p.config.eval_res == 288
    assert pipeline_options(p, DistEnv(), train=True).image_size == p.config.image_size == 224


def test_a_run_evaluates_at_its_eval_res_with_tta_and_its_card_says_so(photo_run):
    _, run = photo_run
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["image_size"], summary["eval_res"], summary["tta"], summary["blurpool"]) \
        == (48, 64, True, True)
    assert summary["decisions"]["eval_res"].startswith("64: 1.3x the 48 px")
    _, card = read_weights(run / BEST_NAME)
    assert (card.image_size, card.eval_size, card.input_size, card.tta, card.blurpool) == \
        (48, 64, 64, True, True)
    assert "64x64" in card.preprocessing["photos"] and "mirror" in card.preprocessing["tta"]


def test_eval_repeats_the_logged_accuracy_and_the_flags_change_how(photo_run, cli):
    data, run = photo_run
    code, out, _ = cli("eval", "--run", run, "--device", "cpu", "--out", run / "e1" / "eval.json")
    assert code == 0 and "for these weights: the same" in out, out
    first = json.loads((run / "e1" / "eval.json").read_text())
    assert (first["eval_res"], first["tta"]) == (64, True)
    code, out, err = cli("eval", "--run", run, "--device", "cpu", "--out", run / "e2" / "eval.json",
                       "--eval-res", "48", "--no-tta")
    assert code == 0 and "the run logged" not in out, err  # not the run's way: not compared
    second = json.loads((run / "e2" / "eval.json").read_text())
    assert (second["eval_res"], second["tta"]) == (48, False)


def test_predict_uses_the_cards_eval_size_and_tta(photo_run, tmp_path, cli):
    from PIL import Image
    _, run = photo_run
    picture = torch.randint(0, 256, (96, 120, 3), dtype=torch.uint8).numpy()
    Image.fromarray(picture).save(tmp_path / "a.png")
    code, out, err = cli("predict", "--run", run, tmp_path / "a.png", "--device", "cpu")
    assert code == 0, err
    assert "evaluated at 64 px, flip TTA" in err + out


@pytest.mark.parametrize("value, message", [
    ("0", "argument --eval-res: must be at least 8, not 0"),
    ("5000", "argument --eval-res: must be at most 4096, not 5000"),
    ("big", "argument --eval-res: invalid int value: 'big'")])
def test_a_bad_eval_res_is_one_line_in_eval(photo_run, capsys, value, message):
    from turbotrain.cli import main
    _, run = photo_run
    with pytest.raises(SystemExit) as exit_:
        main(["eval", "--run", str(run), "--eval-res", value])
    err = capsys.readouterr().err  # argparse's usage, then its one error line
    errors = [line for line in err.splitlines() if "error" in line]
    assert exit_.value.code == 2 and errors == [f"turbotrain eval: error: {message}"], err


@pytest.mark.parametrize("value, message", [
    ("4", "--eval-res must be at least 8, not 4"),
    ("5000", "--eval-res must be at most 4096 (the largest side a weights card holds), not "
             "5000")])
def test_a_bad_eval_res_is_one_line_in_train(photo_run, train_cli, tmp_path, value, message):
    data, _ = photo_run
    code, _, err = train_cli("--data", data, "--out", tmp_path / "r", "--eval-res", value, *RUN)
    assert code == 2 and err.strip().splitlines() == [f"train: error: {message}"], err
