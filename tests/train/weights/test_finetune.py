"""Weights out and in: best/final.safetensors, top-5, --init-from (a run, a plain .pt or
.safetensors), --pretrained from a local cache, the head, --freeze-backbone, --layer-decay,
timm at the run's image size, --model-kwargs, and --resume auto."""
from __future__ import annotations

import json
import signal

import pytest
import torch

from turbotrain.cli import main as turbotrain_main
from turbotrain.train.config.config import TrainConfig
from turbotrain.train.config.config_files import load_yaml
from turbotrain.train.config.model_args import parse_model_kwargs
from turbotrain.train.errors import TrainError
from turbotrain.train.models.models import build_model, get_model_spec
from turbotrain.train.records.checkpoint import checkpoint_path
from turbotrain.train.weights import finetune
from turbotrain.train.weights.weights import load_classifier, read_weights

from ..conftest import FAST, logged_steps, read_jsonl, signal_when, train_subprocess
from ..tiny_data import tiny_images, write_tiny_dataset

# One pytest worker runs this whole module (make test: --dist loadgroup), so its module-scoped
# fixture runs once, not once per worker: source_run trains the run others start from.
pytestmark = [pytest.mark.xdist_group("finetune"), pytest.mark.usefixtures("child_processes")]

CPU = ("--device", "cpu")
TINY_LR = ("--lr", "1e-12")  # one step that leaves the loaded weights as they were


def _one_line_error(code, err):
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("train: error: "), err
    return lines[0]


@pytest.fixture(scope="module")
def source_run(tiny_dataset, tmp_path_factory):
    """A finished 2-epoch compact28 run (12 steps) on the 4-class tiny dataset."""
    out = tmp_path_factory.mktemp("source") / "run"
    code = turbotrain_main(["train", "--data", str(tiny_dataset), "--out", str(out),
                            "--epochs", "2", "--batch-size", "16", *FAST, *CPU])
    assert code == 0
    return out


@pytest.fixture(scope="module")
def six_classes(tmp_path_factory):
    return write_tiny_dataset(tmp_path_factory.mktemp("six") / "ds", num_classes=6)


def _val_batch(n: int = 16, classes: int = 4) -> torch.Tensor:
    images, _ = tiny_images(n, 16, classes, seed=5)
    return torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()


def _params(path) -> dict[str, torch.Tensor]:
    """The net's parameters and buffers in a weights file."""
    state, _ = read_weights(path)
    return {k: v for k, v in state.items() if k.startswith("net.")}


def _backbone_equal(path, source, head: str = "net.7.") -> None:
    got, want = _params(path), _params(source)
    for key, value in want.items():
        if not key.startswith(head) and "running" not in key and "num_batches" not in key:
            torch.testing.assert_close(got[key], value, rtol=0, atol=1e-7, msg=key)


# ---------------------------------------------------------------------------- weights out

def test_best_and_final_weights_rebuild_the_trained_model(source_run, tiny_dataset):
    best, final = source_run / "best.safetensors", source_run / "final.safetensors"
    assert best.is_file() and final.is_file()
    epochs = [r for r in read_jsonl(source_run / "metrics.jsonl") if r["kind"] == "epoch"]
    assert all(r["val_top5"] is None for r in epochs)  # 4 classes: a top-5 would be 100%
    best_epoch = max(epochs, key=lambda r: r["val_accuracy"])  # the first of the best
    _, card = read_weights(best)
    assert card.info["step"] == best_epoch["step"]
    assert card.info["val_accuracy"] == best_epoch["val_accuracy"]
    assert card.info["weights"] == "model" and card.info["dataset"] == str(tiny_dataset)
    _, card = read_weights(final)
    assert (card.model, card.image_size, card.classes) == ("compact28", 16,
                                                          ("class0", "class1", "class2", "class3"))
    assert card.mean == (70.0, 70.0, 70.0) and card.std == (60.0, 60.0, 60.0)
    assert card.info["step"] == 12 and card.info["epoch"] == 2.0
    # final.safetensors is the trained model: the same logits as the checkpoint's weights.
    trained = build_model(get_model_spec("compact28"), 4)
    trained.load_state_dict(torch.load(checkpoint_path(source_run), weights_only=True)["model"])
    loaded, _ = load_classifier(final)
    images = _val_batch()
    assert torch.equal(loaded(images), trained.eval()(images))
    assert load_classifier(source_run)[1].info["step"] == best_epoch["step"]  # a run: its best
    summary = json.loads((source_run / "summary.json").read_text())
    assert summary["val_top5"] is None
    assert summary["best_val_accuracy"] == best_epoch["val_accuracy"]
    assert summary["weights_final"] == str(final)


def test_eval_of_a_four_class_run_reports_no_top_k(cli, source_run, tmp_path):
    """eval's top-k with k = the class count would be 100% for every model: with 5 classes
    or fewer eval.json has top1 only (top_k null) and the summary line says top-1 only."""
    code, stdout, err = cli("eval", "--run", source_run, "--out", tmp_path / "eval.json",
                            "--device", "cpu")
    assert code == 0, err
    result = json.loads((tmp_path / "eval.json").read_text())
    assert result["top_k"] is None and not {"top4", "top5"} & set(result)
    assert all(set(c) >= {"accuracy", "recall"} and "top4" not in c
               for c in result["per_class"])
    line = next(line for line in stdout.splitlines() if "top-1" in line)
    assert "top-4" not in line and "top-5" not in line, line


def test_ema_runs_keep_the_ema_weights(train_cli, tiny_dataset, tmp_path):
    out = tmp_path / "run"
    code, _, err = train_cli("--data", tiny_dataset, "--out", out, "--epochs", 1,
                             "--batch-size", 16, "--ema", *FAST, *CPU)
    assert code == 0, err
    state, card = read_weights(out / "final.safetensors")
    assert card.info["weights"] == "ema"
    ema = torch.load(checkpoint_path(out), weights_only=True)["ema"]["module"]
    assert all(torch.equal(state[k], v) for k, v in ema.items())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["best_val_accuracy"] == summary["ema_val_accuracy"]


def test_top5_counts_the_five_best_guesses(train_cli, six_classes, tmp_path):
    code, _, err = train_cli("--data", six_classes, "--out", tmp_path / "r", "--epochs", 1,
                             "--batch-size", 16, *FAST, *CPU)
    assert code == 0, err
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["val_accuracy"] <= summary["val_top5"] <= 1.0
    assert read_jsonl(tmp_path / "r" / "metrics.jsonl")[-1]["val_top5"] == summary["val_top5"]


# ---------------------------------------------------------------------------- weights in

def test_init_from_a_run_of_the_same_classes(train_cli, source_run, tiny_dataset, tmp_path):
    code, stdout, err = train_cli("--data", tiny_dataset, "--out", tmp_path / "r",
                                  "--init-from", source_run, "--epochs", 1, "--max-steps", 1,
                                  "--batch-size", 16, *FAST, *CPU)
    assert code == 0, err
    assert f"  init: {source_run / 'best.safetensors'} (compact28, step " in stdout
    assert "  model: compact28: the model of the --init-from weights" in stdout
    assert "  image_size: 16: 16 px, the size the --init-from weights learnt at" in stdout
    assert "  normalisation: mean 70/70/70 std 60/60/60: the source run's own" in stdout
    assert "  head: net.7 kept: the weights were trained on these 4 classes" in stdout
    # The recipe: the same classes, so 0.1 x compact28's 0.4 x 16/256, and a short warm-up.
    assert "  lr: 0.0025: compact28's 0.4 per 256 images x 16/256, x0.1: " in stdout
    assert "  warmup_steps: 1: 2% of the 1 steps" in stdout
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    source = json.loads((source_run / "summary.json").read_text())
    assert summary["val_accuracy"] >= source["best_val_accuracy"] - 0.15  # it started trained


def test_init_from_a_run_of_other_classes_replaces_the_head(train_cli, source_run, six_classes,
                                                            tmp_path):
    out = tmp_path / "r"
    code, stdout, err = train_cli("--data", six_classes, "--out", out, "--init-from",
                                  source_run / "final.safetensors", "--epochs", 1,
                                  "--max-steps", 1, "--batch-size", 16, *TINY_LR, *FAST, *CPU)
    assert code == 0, err
    assert "  head: net.7 replaced: the weights have 4 classes, this dataset 6: a fresh head" \
        in stdout
    _backbone_equal(out / "final.safetensors", source_run / "final.safetensors")
    assert _params(out / "final.safetensors")["net.7.weight"].shape == (6, 128)


@pytest.mark.parametrize("kind", ["state_dict.pt", "plain.safetensors", "checkpoint.pt"])
def test_init_from_plain_weights(kind, train_cli, source_run, tiny_dataset, tmp_path):
    from safetensors.torch import save_file
    state, _ = read_weights(source_run / "final.safetensors")
    path = tmp_path / kind
    if kind == "state_dict.pt":  # torchvision-style: the net's own keys, no prefix
        torch.save({k[4:]: v for k, v in state.items() if k.startswith("net.")}, path)
    elif kind == "plain.safetensors":  # a whole Classifier state, no card
        save_file(state, str(path))
    else:  # a turbotrain checkpoint: its "model"
        path.write_bytes(checkpoint_path(source_run).read_bytes())
    out = tmp_path / "r"
    code, stdout, err = train_cli("--data", tiny_dataset, "--out", out, "--model", "compact28",
                                  "--init-from", path, "--epochs", 1, "--max-steps", 1,
                                  "--batch-size", 16, *TINY_LR, *FAST, *CPU)
    assert code == 0, err
    assert f"  init: {path} (a plain state_dict): --init-from" in stdout
    assert "  normalisation: the dataset's mean/std: the weights name no input statistics" \
        in stdout
    assert "  head: net.7 kept" in stdout
    _backbone_equal(out / "final.safetensors", source_run / "final.safetensors", head="-")


def test_init_from_weights_of_another_model_is_one_line(train_cli, source_run, tiny_dataset,
                                                        tmp_path):
    line = _one_line_error(*train_cli("--data", tiny_dataset, "--out", tmp_path / "r",
                                      "--model", "resnet9", "--init-from",
                                      source_run / "final.safetensors", *FAST, *CPU)[::2])
    assert "do not fit resnet9" in line and "missing" in line


def test_init_from_a_folder_without_weights(train_cli, tiny_dataset, tmp_path):
    (tmp_path / "empty").mkdir()
    line = _one_line_error(*train_cli("--data", tiny_dataset, "--out", tmp_path / "r",
                                      "--init-from", tmp_path / "empty", *FAST, *CPU)[::2])
    assert "holds no best.safetensors or final.safetensors" in line


def _fake_torchvision_cache(torch_home):
    """resnet18's ImageNet weights where torchvision would cache them: a real state_dict of
    the right shapes (random values), saved under the expected file name."""
    import torchvision
    path = torch_home / "hub" / "checkpoints" / "resnet18-f37072fd.pth"
    path.parent.mkdir(parents=True)
    torch.manual_seed(1)
    state = torchvision.models.resnet18(num_classes=1000).state_dict()
    torch.save(state, path)
    return state


def test_pretrained_torchvision_weights_from_the_cache(train_cli, tiny_dataset, tmp_path,
                                                       monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    state = _fake_torchvision_cache(tmp_path / "torch")
    out = tmp_path / "r"
    code, stdout, err = train_cli("--data", tiny_dataset, "--out", out, "--pretrained",
                                  "--epochs", 1, "--max-steps", 1, "--batch-size", 16,
                                  *TINY_LR, *FAST, *CPU)
    assert code == 0, err
    assert "  model: resnet18: --pretrained: resnet18" in stdout  # --model auto
    assert ("  init: torchvision's ResNet18_Weights.IMAGENET1K_V1 (resnet18-f37072fd.pth): "
            "--pretrained") in stdout
    assert "  normalisation: mean 123.7/116.3/103.5 std 58.4/57.12/57.38: ImageNet's" in stdout
    assert "  head: net.fc replaced: the weights have 1000 classes, this dataset 4" in stdout
    loaded = _params(out / "final.safetensors")
    torch.testing.assert_close(loaded["net.conv1.weight"], state["conv1.weight"], rtol=0,
                               atol=1e-7)
    assert loaded["net.fc.weight"].shape == (4, 512)


def test_pretrained_weights_missing_from_the_cache_is_one_line(train_cli, tiny_dataset,
                                                               tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    line = _one_line_error(*train_cli("--data", tiny_dataset, "--out", tmp_path / "r",
                                      "--model", "resnet18", "--pretrained", *FAST, *CPU)[::2])
    path = tmp_path / "torch" / "hub" / "checkpoints" / "resnet18-f37072fd.pth"
    assert line == ("train: error: --pretrained: resnet18's weights are not in the cache; "
                    "add --download to fetch them, or download "
                    "https://download.pytorch.org/models/resnet18-f37072fd.pth to "
                    f"{path} (or set TORCH_HOME)")
    line = _one_line_error(*train_cli("--data", tiny_dataset, "--out", tmp_path / "r",
                                      "--model", "compact28", "--pretrained", *FAST)[::2])
    assert "compact28 has no published weights" in line and "--init-from" in line


def test_download_fetches_pretrained_weights_and_says_where_when_it_cannot(
        tiny_dataset, tmp_path):
    """--download is the one way weights are fetched. Here no network is reachable (a proxy on
    a closed port stands for it): the real command ends in one line naming the URL and the
    file to put there; --download without --pretrained is refused."""
    import os
    import subprocess
    import sys
    env = {**os.environ, "TORCH_HOME": str(tmp_path / "torch"),
           "https_proxy": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9"}
    done = subprocess.run([sys.executable, "-m", "turbotrain", "train", "--data",
                           str(tiny_dataset), "--out", str(tmp_path / "r"), "--model",
                           "resnet18", "--pretrained", "--download", "--device", "cpu"],
                          capture_output=True, text=True, timeout=240, env=env)
    path = tmp_path / "torch" / "hub" / "checkpoints" / "resnet18-f37072fd.pth"
    line = _one_line_error(done.returncode, done.stderr)
    assert line.startswith("train: error: --download: cannot fetch "
                           "https://download.pytorch.org/models/resnet18-f37072fd.pth (")
    assert line.endswith(f"); download it where there is a network and copy it to {path}")
    assert not path.exists() and not (tmp_path / "r").exists()
    done = subprocess.run([sys.executable, "-m", "turbotrain", "train", "--data",
                           str(tiny_dataset), "--download"], capture_output=True, text=True,
                          timeout=240)
    assert _one_line_error(done.returncode, done.stderr) == (
        "train: error: --download fetches --pretrained weights: add --pretrained (or drop "
        "--download)")


def test_pretrained_timm_weights_missing_from_the_hf_cache_is_one_line(
        train_cli, tiny_dataset, tmp_path, monkeypatch):
    import timm  # noqa: F401  (make install installs it: the [timm] extra)
    from huggingface_hub import constants
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    offline = constants.HF_HUB_OFFLINE
    line = _one_line_error(*train_cli("--data", tiny_dataset, "--out", tmp_path / "r",
                                      "--model", "timm:resnet18", "--pretrained", *FAST,
                                      *CPU)[::2])
    assert line.startswith("train: error: --pretrained: timm:resnet18's weights (timm/resnet18.")
    assert f"are not in the Hugging Face cache {tmp_path / 'hf'};" in line
    assert constants.HF_HUB_OFFLINE == offline  # offline for the load only


def test_pretrained_timm_weights_from_the_hf_cache(train_cli, tiny_dataset, tmp_path,
                                                  monkeypatch):
    import timm
    from huggingface_hub import constants
    from safetensors.torch import save_file
    # The Hugging Face cache's layout: refs/main names a snapshot that holds the file.
    hub_id = timm.models.get_pretrained_cfg("resnet18").hf_hub_id
    repo = tmp_path / "hf" / f"models--{hub_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("a" * 40)
    (repo / "snapshots" / ("a" * 40)).mkdir(parents=True)
    torch.manual_seed(2)
    state = {k: v.contiguous() for k, v in timm.create_model("resnet18").state_dict().items()}
    save_file(state, str(repo / "snapshots" / ("a" * 40) / "model.safetensors"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    out = tmp_path / "r"
    # bf16 asked for, so every CPU runs the bf16 step (auto picks it only with native bf16).
    code, stdout, err = train_cli("--data", tiny_dataset, "--out", out, "--model",
                                  "timm:resnet18", "--pretrained", "--epochs", 1,
                                  "--max-steps", 1, "--batch-size", 16, "--precision", "bf16",
                                  *TINY_LR, *FAST, *CPU)
    assert code == 0, err
    assert f"  init: timm's {hub_id}: --pretrained" in stdout
    assert "  normalisation: mean 123.7/116.3/103.5 std 58.4/57.12/57.38: ImageNet's" in stdout
    assert "  head: net.fc replaced: the weights have 1000 classes, this dataset 4" in stdout
    assert "  img_size: not passed: timm:resnet18 takes no img_size" in stdout
    torch.testing.assert_close(_params(out / "final.safetensors")["net.conv1.weight"],
                               state["conv1.weight"], rtol=0, atol=1e-7)


def test_freeze_backbone_trains_only_the_head(train_cli, source_run, six_classes, tmp_path):
    out = tmp_path / "r"
    code, stdout, err = train_cli("--data", six_classes, "--out", out, "--init-from",
                                  source_run, "--freeze-backbone", "--epochs", 1,
                                  "--batch-size", 16, *FAST, *CPU)
    assert code == 0, err
    assert "  freeze_backbone: only net.7 trains (768 weights)" in stdout
    assert "--freeze-backbone: a fresh head learns alone, at the from-scratch rate" in stdout
    got, source = _params(out / "final.safetensors"), _params(source_run / "best.safetensors")
    for key, value in source.items():  # the BatchNorm statistics too: eval mode
        if not key.startswith("net.7."):
            assert torch.equal(got[key], value), key
    assert got["net.7.weight"].abs().sum() > 0


def test_freeze_backbone_needs_starting_weights(train_cli, tiny_dataset, tmp_path):
    line = _one_line_error(*train_cli("--data", tiny_dataset, "--out", tmp_path / "r",
                                      "--freeze-backbone", *FAST)[::2])
    assert "--freeze-backbone" in line and "--pretrained or --init-from" in line


def test_layer_decay_groups_by_depth():
    decided = {}
    config = TrainConfig(data="d", layer_decay=0.5)
    model = build_model(get_model_spec("compact28"), 4)
    groups = finetune.optimizer_groups(model, config, num_classes=4, lr=1.0,
                                       weight_decay=0.1,
                                       decide=lambda what, value, why: decided.update({what: value}))
    assert groups[0]["lr"] == 1.0 and len(groups[0]["params"]) == 1
    assert groups[0]["params"][0] is model.net[7].weight  # the head first: the logged LR
    assert sorted({g["lr"] for g in groups}) == [0.5 ** k for k in range(5, -1, -1)]
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))
    assert all(g["weight_decay"] == (0.1 if g["params"][0].ndim >= 2 else 0.0) for g in groups)
    assert decided["layer_decay"] == "0.5 over 6 depths"
    resnet = build_model(get_model_spec("resnet18"), 4)
    depths = finetune.depth_of_parameters(resnet.net, "fc")
    assert depths["conv1.weight"] == depths["bn1.bias"] == 0
    assert [depths[f"layer{k}.0.conv1.weight"] for k in range(1, 5)] == [1, 2, 3, 4]
    assert depths["fc.weight"] == 5


# ---------------------------------------------------------------------------- timm, kwargs

def test_timm_vit_trains_at_the_runs_size_and_rebuilds_from_its_card(train_cli, tiny_dataset,
                                                                    tmp_path):
    import timm  # noqa: F401  (make install installs it: the [timm] extra)
    out = tmp_path / "r"
    code, stdout, err = train_cli("--data", tiny_dataset, "--out", out, "--model",
                                  "timm:vit_tiny_patch16_224", "--image-size", 32,
                                  "--model-kwargs", "drop_rate=0.1", "--epochs", 1,
                                  "--max-steps", 1, "--batch-size", 16, *FAST, *CPU)
    assert code == 0, err
    assert "  img_size: 32: built with img_size=32, the run's image size" in stdout
    assert load_yaml(out / "config.yaml")["model_kwargs"] == '{"drop_rate":0.1}'
    model, card = load_classifier(out)
    assert card.model_kwargs == {"drop_rate": 0.1} and card.image_size == 32
    trained = build_model(get_model_spec("timm:vit_tiny_patch16_224",
                                         model_kwargs={"drop_rate": 0.1}, image_size=32), 4)
    trained.load_state_dict(torch.load(checkpoint_path(out), weights_only=True)["model"])
    images = torch.nn.functional.interpolate(_val_batch().float(), size=32).to(torch.uint8)
    assert torch.equal(model(images), trained.eval()(images))


def test_timm_conv_nets_take_no_img_size():
    import timm  # noqa: F401  (make install installs it: the [timm] extra)
    spec = get_model_spec("timm:resnet18", image_size=32)
    assert "img_size" not in spec.kwargs and "takes no img_size" in spec.note


@pytest.mark.parametrize("text, message", [
    ("drop_rate", "is not KEY=VALUE"),
    ("{not json", "not valid JSON"),
    ('{"block": {"a": 1}}', "block must be a number"),
    ("num_classes=3", "num_classes is set by turbotrain"),
    ("img_size=64", "img_size is set by turbotrain (--image-size)"),
    ("2x=1", "is not an argument name"),
])
def test_model_kwargs_are_checked(text, message):
    with pytest.raises(TrainError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_model_kwargs(text)
    assert parse_model_kwargs('drop_rate=0.1, global_pool=avg') == {"drop_rate": 0.1,
                                                                   "global_pool": "avg"}


def test_model_kwargs_the_model_does_not_take_are_one_line(train_cli, tiny_dataset, tmp_path):
    line = _one_line_error(*train_cli("--data", tiny_dataset, "--out", tmp_path / "r",
                                      "--model", "compact28", "--model-kwargs", "width=3",
                                      *FAST)[::2])
    assert line == ("train: error: --model-kwargs: compact28 takes no keyword arguments, not "
                    "width")
    line = _one_line_error(*train_cli("--data", tiny_dataset, "--out", tmp_path / "r",
                                      "--model", "resnet18", "--model-kwargs", "bogus=1",
                                      *FAST)[::2])
    assert line.startswith("train: error: --model-kwargs: resnet18 refuses them (")


# ---------------------------------------------------------------------------- --resume auto

def test_new_settings_round_trip_and_resume_takes_an_optional_auto(tmp_path):
    import argparse

    from turbotrain.train.config.config_files import config_from_namespace, save_yaml
    from turbotrain.train.config.config_flags import add_config_arguments
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    parse = lambda *argv: parser.parse_args([str(a) for a in argv])  # noqa: E731
    assert parse("--resume").resume is True and parse("--no-resume").resume is False
    assert parse("--resume", "auto").resume == "auto"
    assert parse("--resume", "--epochs", "3").resume is True
    config = TrainConfig(data="d", model="timm:vit_tiny_patch16_224", init_from="runs/a",
                         freeze_backbone=True, layer_decay=0.75,
                         model_kwargs='{"drop_rate":0.1}', out=str(tmp_path), resume="auto")
    save_yaml(config, tmp_path / "config.yaml")
    assert TrainConfig(**load_yaml(tmp_path / "config.yaml")) == config.replace(resume=False)
    # auto without a checkpoint: a new run, so the folder's config.yaml is not read.
    fresh = config_from_namespace(parse("--data", "d", "--out", tmp_path / "new", "--resume",
                                        "auto"))
    assert fresh.resume == "auto" and fresh.model == "auto"
    with pytest.raises(TrainError, match=r"--layer-decay must be in \(0, 1\]"):
        config.replace(layer_decay=0.0).validate()
    with pytest.raises(TrainError, match="--pretrained and --init-from both"):
        config.replace(pretrained=True).validate()

def test_resume_auto_starts_then_continues_the_same_command(tiny_dataset, tmp_path):
    out = tmp_path / "run"
    command = ("--data", tiny_dataset, "--out", out, "--resume", "auto", "--epochs", 2,
               "--batch-size", 8, "--checkpoint-every", 2, "--pipeline", "test-slow",
               "--threads", 1, "--workers", 0, "--log-every", 1, *CPU)
    first = train_subprocess(*command)
    stdout, err = signal_when(lambda: logged_steps(out) >= 3, first, signal.SIGTERM)
    assert first.returncode == 128 + signal.SIGTERM, err
    assert f"  resume: False: auto: no checkpoint in {out} yet: a new run" in stdout
    second = train_subprocess(*command)
    stdout, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    assert f"  resume: True: auto: {out} holds a checkpoint" in stdout and "resuming" in stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 24 and summary["outcome"] == "completed"


def test_resume_auto_never_takes_a_folder_of_other_files(train_cli, tiny_dataset, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    line = _one_line_error(*train_cli("--data", tiny_dataset, "--out", tmp_path, "--resume",
                                      "auto", *FAST)[::2])
    assert line == (f"train: error: --resume auto: --out {tmp_path} has no checkpoint.pt to "
                    "continue and is not empty (holds notes.txt), so no new run can start "
                    "there either; choose another --out")
    line = _one_line_error(*train_cli("--data", tiny_dataset, "--resume", "auto", *FAST)[::2])
    assert "--resume auto needs --out RUNDIR" in line
