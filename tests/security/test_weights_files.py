"""A weights file is a stranger's input: its card is checked field by field, and the model it
describes is compared with the file's tensors on the meta device before anything is built
(model_check.py). Each case runs the real `predict` (what eval and export share:
weights.load_classifier) or `train` in a confined child with a memory cap; then a seeded fuzz
of safetensors headers and cards in one confined child."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

from tests.train.tiny_data import write_tiny_dataset

from .confined import run_json_script
from .model_child import run_cli
from .train_child import ADDRESS_SPACE_LIMIT, FAST, PEAK_RSS_LIMIT

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("child_processes")]

FUZZ_SCRIPT = Path(__file__).with_name("fuzz_weights.py")
FUZZ_CASES = 300  # ~15 s on the 2-core box


def _small_file(path: Path, **card) -> Path:
    """compact28's tensors for 2 classes (0.5 MB) under a card that says what `card` says."""
    from turbotrain.train.models.models import build_model, get_model_spec
    model = build_model(get_model_spec("compact28"), 2)
    full = {"format": 1, "model": "compact28", "classes": ["a", "b"], "image_size": 16,
            "mean": [70, 70, 70], "std": [60, 60, 60], "model_kwargs": {}, "info": {}, **card}
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path),
              metadata={"turbotrain": json.dumps(full)})
    return path


@pytest.fixture
def image(tmp_path) -> Path:
    path = tmp_path / "x.png"
    Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(path)
    return path


def _predict(weights: Path, image: Path, tmp_path: Path) -> str:
    ran = run_cli("predict", "--weights", weights, image, "--device", "cpu", cwd=tmp_path)
    return ran.error_line("turbotrain predict: error: ")


def test_a_small_file_whose_card_describes_a_huge_model(image, tmp_path):
    # ResNet-50 with width_per_group=1024: 3 G parameters, 12 GB, from a 0.5 MB file.
    weights = _small_file(tmp_path / "w.safetensors", model="resnet50",
                          model_kwargs={"width_per_group": 1024})
    line = _predict(weights, image, tmp_path)
    assert line.startswith(f"turbotrain predict: error: {weights}: its weights do not fit model "
                           "resnet50 with 2 classes, as its card says (the file lacks ")


def test_a_card_with_more_classes_than_a_dataset_may_have(image, tmp_path):
    weights = _small_file(tmp_path / "w.safetensors", classes=[""] * 4_000_000)  # 12 MB of JSON
    line = _predict(weights, image, tmp_path)
    assert line == (f"turbotrain predict: error: {weights}: not a turbotrain weights file "
                    "(4,000,000 class names, more than the 200,000 a dataset may have)")


def test_a_cards_constructor_error_is_one_line(image, tmp_path):
    weights = _small_file(tmp_path / "w.safetensors", model="resnet18",
                          model_kwargs={"width_per_group": 128})
    line = _predict(weights, image, tmp_path)
    assert line == (f"turbotrain predict: error: {weights}: its card's model_kwargs: resnet18 "
                    "refuses them (ValueError: BasicBlock only supports groups=1 and "
                    "base_width=64)")


@pytest.mark.parametrize("kwargs, says", [
    ("width_per_group=128", "--model-kwargs: resnet18 refuses them (ValueError: BasicBlock only "
                            "supports groups=1 and base_width=64)"),
    (f"groups={10**40}", "--model-kwargs: groups must be a number (at most 2,147,483,648"),
])
def test_model_kwargs_a_constructor_refuses_are_one_line(tmp_path, kwargs, says):
    data = write_tiny_dataset(tmp_path / "ds")
    ran = run_cli("train", "--data", data, "--out", tmp_path / "run", "--model", "resnet18",
                  "--model-kwargs", kwargs, *FAST, cwd=tmp_path)
    assert ran.error_line("train: error: ").startswith(f"train: error: {says}")


def test_safetensors_headers_and_cards_fuzz(tmp_path):
    torch.manual_seed(0)
    result = run_json_script(FUZZ_SCRIPT, tmp_path / "work", FUZZ_CASES, 20261202,
                             address_space=ADDRESS_SPACE_LIMIT, timeout=200,
                             peak_rss=PEAK_RSS_LIMIT)
    assert result["cases"] == FUZZ_CASES
    assert result["problems"] == []
