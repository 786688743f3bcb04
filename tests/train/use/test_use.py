"""From a run to a model people use: `eval`, `predict` and `export` on a real Fashion-MNIST run.

One run is trained for the module (the real `prepare` and `train` commands on 5,000 training
and 1,000 val images, compact28, one epoch: ~15 s on the 2-core box); then `eval` must repeat
the val accuracy the run logged for its best.safetensors, `predict` on 200 of the val images
written out as PNG files must give eval's classes, and every export format must reproduce the
eager model's logits. The error cases each end in one line and exit code 2.
"""
from __future__ import annotations

import csv
import gzip
import json
import os
import re
import struct
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from turbotrain.cli import main as turbotrain_main
from turbotrain.datasets.sources.arrays import FASHION_MNIST_CLASSES
from turbotrain.train.records.report import read_metrics
from turbotrain.train.weights.weights import BEST_NAME, ModelCard, load_classifier, save_weights

FASHION = Path("/usr/share/datasets/fashion-mnist")
TRAIN, VAL, PNGS = 5000, 1000, 200

# One pytest worker runs this whole module (make test: --dist loadgroup), so its module-scoped
# fixture runs once, not once per worker: its fixtures train and evaluate a run (~23 s).
pytestmark = [pytest.mark.timeout(180), pytest.mark.xdist_group("use"),
              pytest.mark.usefixtures("child_processes")]


def _idx(name: str, offset: int, count: int, shape=()) -> np.ndarray:
    raw = np.frombuffer(gzip.open(FASHION / name).read(), dtype=np.uint8, offset=offset)
    return raw.reshape(-1, *shape)[:count]


@pytest.fixture(scope="module")
def fashion(tmp_path_factory):
    """(prepared dataset, run folder, val images): a 1-epoch compact28 run on a slice of the
    real Fashion-MNIST, through the real commands."""
    assert FASHION.is_dir(), "apt-get install dataset-fashion-mnist (CI installs it)"
    root = tmp_path_factory.mktemp("use")
    val_images = _idx("t10k-images-idx3-ubyte.gz", 16, VAL, (28, 28))
    np.savez(root / "fashion.npz",
             images=_idx("train-images-idx3-ubyte.gz", 16, TRAIN, (28, 28)),
             labels=_idx("train-labels-idx1-ubyte.gz", 8, TRAIN),
             val_images=val_images, val_labels=_idx("t10k-labels-idx1-ubyte.gz", 8, VAL),
             classes=np.array(FASHION_MNIST_CLASSES))
    data, run = root / "data", root / "run"
    assert turbotrain_main(["prepare", str(root / "fashion.npz"), str(data), "--workers",
                            "1"]) == 0
    assert turbotrain_main(["train", "--data", str(data), "--epochs", "1", "--out", str(run),
                            "--pipeline", "pytorch", "--threads", "1", "--workers", "1",
                            "--log-every", "1000"]) == 0
    assert (run / BEST_NAME).is_file(), "train writes RUN/best.safetensors"
    return data, run, val_images


@pytest.fixture(scope="module")
def evaluated(fashion):
    """`turbotrain eval --run RUN`'s eval.json."""
    _, run, _ = fashion
    assert turbotrain_main(["eval", "--run", str(run)]) == 0
    return json.loads((run / "eval.json").read_text())


def one_error_line(err: str, prog: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"turbotrain {prog}: error: "), err
    return lines[0]


# -- eval -----------------------------------------------------------------------------------------
def test_eval_repeats_the_val_accuracy_the_run_logged(fashion, evaluated):
    _, run, _ = fashion
    card = load_classifier(run)[1]
    logged = [r for r in read_metrics(run) if r["kind"] == "epoch"][-1]
    assert card.info["step"] == logged["step"]
    # To the last digit: the same weights, pipeline, batches and precision as the run's eval.
    assert evaluated["top1"] == card.info["val_accuracy"] == logged["val_accuracy"]
    assert evaluated["top5"] == logged["val_top5"]
    assert evaluated["loss"] == pytest.approx(logged["val_loss"], rel=1e-9)
    assert evaluated["images"] == VAL and evaluated["top_k"] == 5
    assert [c["class"] for c in evaluated["per_class"]] == FASHION_MNIST_CLASSES
    matrix = np.array(evaluated["confusion"])
    assert matrix.shape == (10, 10) and matrix.sum() == VAL
    assert np.trace(matrix) == round(evaluated["top1"] * VAL)
    for k, c in enumerate(evaluated["per_class"]):
        assert c["support"] == matrix[k].sum() and c["predicted"] == matrix[:, k].sum()
        assert c["recall"] == c["accuracy"] == matrix[k, k] / matrix[k].sum()
        assert c["precision"] == pytest.approx(matrix[k, k] / matrix[:, k].sum())
    assert len(evaluated["predictions"]) == VAL
    assert Path(evaluated["confusion_png"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_eval_prints_a_summary_and_takes_weights_and_out(fashion, evaluated, cli, tmp_path):
    data, run, _ = fashion
    out = tmp_path / "elsewhere" / "e.json"
    code, stdout, err = cli("eval", "--weights", run / "final.safetensors", "--data", data,
                            "--batch-size", 100, "--pipeline", "resident", "--out", out)
    assert code == 0, err
    assert re.search(r"top-1 \d+\.\d\d%, top-5 \d+\.\d\d%, loss \d\.\d{4}", stdout), stdout
    result = json.loads(out.read_text())
    assert (tmp_path / "elsewhere" / "confusion.png").is_file()
    assert result["pipeline"] == "resident" and result["batch_size"] == 100
    assert result["images"] == VAL


def test_eval_of_an_ema_run_repeats_the_accuracy_of_the_ema_weights(cli, tiny_dataset,
                                                                    tmp_path):
    """With --ema the weights files hold the EMA weights, and the card their own accuracy."""
    run = tmp_path / "ema"
    code, _, err = cli("train", "--data", tiny_dataset, "--out", run, "--epochs", 2,
                       "--batch-size", 16, "--ema", "--ema-decay", "0.9", "--pipeline",
                       "pytorch", "--threads", 1, "--workers", 0, "--device", "cpu")
    assert code == 0, err
    card = load_classifier(run)[1]
    assert card.info["weights"] == "ema"
    code, stdout, err = cli("eval", "--run", run)
    assert code == 0, err
    assert json.loads((run / "eval.json").read_text())["top1"] == card.info["val_accuracy"]
    assert "for these weights: the same" in stdout


def test_confusion_picture_above_50_classes_and_no_matrix_above_the_cap(tmp_path):
    from turbotrain.train.use import evaluate
    n = 60
    matrix = np.random.default_rng(0).integers(0, 5, (n, n))
    written = evaluate.write_results({"confusion": matrix.tolist(), "classes": n},
                                     tmp_path / "a" / "eval.json", [f"c{i}" for i in range(n)])
    assert written[1].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    big = evaluate.MAX_CONFUSION_CLASSES + 1
    written = evaluate.write_results({"confusion": None, "classes": big},
                                     tmp_path / "b" / "eval.json", [])
    saved = json.loads(written[0].read_text())
    assert len(written) == 1 and saved["confusion_png"] is None
    assert "the confusion matrix is kept up to 1,000" in saved["confusion_note"]


# -- predict --------------------------------------------------------------------------------------
def write_pngs(folder: Path, images: np.ndarray) -> list[Path]:
    """Grey PNGs, one sub-folder deep, one name with a comma (the CSV must quote it)."""
    paths = []
    for i, image in enumerate(images):
        path = folder / f"part{i // 100}" / (f"{i:04d}.png" if i != 7 else "0007,b.png")
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(path)
        paths.append(path)
    return paths


def test_predict_gives_evals_classes_on_the_same_images(fashion, evaluated, cli, tmp_path):
    _, run, val_images = fashion
    paths = write_pngs(tmp_path / "pngs", val_images[:PNGS])
    out = tmp_path / "preds.csv"
    code, stdout, err = cli("predict", "--run", run, tmp_path / "pngs", "--top-k", 3,
                            "--out", out)
    assert code == 0, err
    assert f"predicted {PNGS} images" in stdout
    with out.open(newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["path", "class", "prob", "class_2", "prob_2", "class_3", "prob_3"]
    by_path = {row[0]: row for row in rows[1:]}
    assert len(by_path) == PNGS
    for i, path in enumerate(paths):
        row = by_path[str(path)]
        assert row[1] == FASHION_MNIST_CLASSES[evaluated["predictions"][i]], (i, row)
        probs = [float(p) for p in row[2::2]]
        assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1.000001


def _bomb_png(path: Path) -> None:
    """A valid 1x1 PNG whose header then claims 30,000 x 30,000 pixels (900 Mpx)."""
    Image.new("L", (1, 1)).save(path)
    data = bytearray(path.read_bytes())
    data[16:24] = struct.pack(">II", 30000, 30000)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    path.write_bytes(bytes(data))


def test_predict_refuses_unreadable_files_in_one_line_or_skips_them(fashion, cli, tmp_path):
    _, run, val_images = fashion
    folder = tmp_path / "mixed"
    folder.mkdir()
    for i in range(3):
        Image.fromarray(val_images[i]).save(folder / f"good{i}.png")
    (folder / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    _bomb_png(folder / "a_bomb.png")
    os.mkfifo(folder / "pipe.png")  # would block a plain open() forever
    code, stdout, err = cli("predict", "--run", run, folder)
    assert code == 2 and stdout == ""
    line = one_error_line(err, "predict")
    assert "a_bomb.png: decompression bomb" in line and "Mpx limit" in line, line

    code, stdout, err = cli("predict", "--run", run, folder, "--on-error", "skip")
    assert code == 0, err
    skipped = [line for line in err.splitlines() if ": skipped " in line]
    assert len(skipped) == 3, err
    assert any("broken.png: corrupt PNG" in line for line in skipped), skipped
    assert any("pipe.png: is a named pipe" in line for line in skipped), skipped
    assert [row[0] for row in csv.reader(stdout.splitlines())][1:] == [
        str(folder / f"good{i}.png") for i in range(3)]


def test_predict_reads_a_csv_list_and_refuses_rows_leading_out_of_it(fashion, cli, tmp_path):
    _, run, val_images = fashion
    (tmp_path / "imgs").mkdir()
    for i in range(3):
        Image.fromarray(val_images[i]).save(tmp_path / "imgs" / f"{i}.png")
    listed = tmp_path / "list.csv"  # prepare-dataset's path,label form; the labels are unused
    listed.write_text("path,label\nimgs/2.png,Coat\nimgs/0.png,Bag\n")
    code, stdout, err = cli("predict", "--run", run, listed, "--top-k", 1)
    assert code == 0, err
    assert [row[0] for row in csv.reader(stdout.splitlines())] == [
        "path", str(tmp_path / "imgs" / "2.png"), str(tmp_path / "imgs" / "0.png")]
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "list.txt").write_text("../imgs/0.png\n")  # one path per line
    code, stdout, err = cli("predict", "--run", run, tmp_path / "sub" / "list.txt")
    assert code == 2 and stdout == ""
    assert "outside the source folder" in one_error_line(err, "predict")


# -- export ---------------------------------------------------------------------------------------
def _run_exported(fmt: str, path: Path):
    if fmt == "safetensors":
        model, card = load_classifier(path)
        assert card.classes == tuple(FASHION_MNIST_CLASSES) and card.image_size == 28
        return lambda x: model(x)
    if fmt == "torchscript":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch.jit is deprecated
            model = torch.jit.load(str(path))
        return lambda x: model(x)
    import onnxruntime
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].type == "tensor(uint8)"
    return lambda x: torch.from_numpy(session.run(["logits"], {"images": x.numpy()})[0])


@pytest.mark.parametrize("fmt", ["safetensors", "torchscript", "onnx"])
def test_export_reproduces_the_eager_logits(fashion, cli, tmp_path, fmt):
    data, run, _ = fashion
    out = tmp_path / f"model.{fmt}"
    code, stdout, err = cli("export", "--run", run, "--format", fmt, "--out", out)
    assert code == 0, err
    found = re.search(r"checked on 16 images of .*: largest \|logit difference\| (\S+) "
                      r"\(tolerance (\S+)\)", stdout)
    assert found and float(found.group(1)) <= float(found.group(2)), stdout
    from turbotrain.datasets import open_dataset
    from turbotrain.pipeline import build_pipeline
    pipeline = build_pipeline("pytorch", open_dataset(data, "val"), train=False, batch_size=37,
                              image_size=28, device=torch.device("cpu"), workers=1)
    images = next(iter(pipeline))[0].contiguous()
    pipeline.close()
    eager = load_classifier(run)[0]
    exported = _run_exported(fmt, out)
    with torch.no_grad():
        for batch in (images, images[:1]):  # the batch axis is dynamic
            expected = eager(batch)
            assert torch.allclose(exported(batch).float(), expected, rtol=0,
                                  atol=1e-4 * max(1.0, float(expected.abs().max())))


def test_the_exported_card_states_the_preprocessing(fashion, tmp_path):
    """The card had mean/std and classes but not the resize/crop rule, and a naive resize of a
    photo gives other predictions: export (the real command, in a child process) prints the
    rule and writes it in the file's card, and the weights files' cards hold it too."""
    from tests.datasets.cli_run import cli as run_cli
    from turbotrain.pipeline import augment
    from turbotrain.pipeline.base import PipelineOptions
    _, run, _ = fashion
    out = tmp_path / "model.pt"
    done = run_cli("export", "--run", run, "--format", "torchscript", "--out", out)
    assert done.returncode == 0, done.stderr
    rule = augment.eval_rule(28, PipelineOptions.crop_ratio)
    assert rule["photos"].startswith("longest side over 64 px: resize the shorter side to "
                                     "32 px (image_size / 0.875), then take the centre 28x28 "
                                     "crop")
    assert f"{rule['photos']}; {rule['small images']}" in done.stdout
    files = {"card.json": ""}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit is deprecated
        torch.jit.load(str(out), _extra_files=files)
    card = json.loads(files["card.json"])
    assert card["preprocessing"]["photos"] == rule["photos"]
    assert card["preprocessing"]["small images"] == rule["small images"]
    assert "do not normalise" in card["preprocessing"]["input"]
    assert "shrunk to 512" in card["preprocessing"]["stored"]
    _, best = load_classifier(run)
    assert json.loads(best.to_json())["preprocessing"] == card["preprocessing"]


def test_export_fails_in_one_line_above_the_tolerance(fashion, cli, tmp_path, monkeypatch):
    from turbotrain.train.use import export
    real = export.EXPORTERS["torchscript"]

    def off_by_one(model, loaded, path):
        how, run_file = real(model, loaded, path)
        return how, lambda images: run_file(images) + 1.0
    monkeypatch.setitem(export.EXPORTERS, "torchscript", off_by_one)
    out = tmp_path / "model.pt"
    code, stdout, err = cli("export", "--run", fashion[1], "--format", "torchscript",
                            "--out", out)
    assert code == 1
    assert "differ from the model's by up to 1" in one_error_line(err, "export")
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_export_onnx_says_how_to_install_what_is_missing(fashion, cli, monkeypatch):
    from turbotrain.train.use import export
    real = export.importlib.util.find_spec
    monkeypatch.setattr(export.importlib.util, "find_spec",
                        lambda name, *a: None if name == "onnxruntime" else real(name, *a))
    code, _, err = cli("export", "--run", fashion[1], "--format", "onnx")
    assert code == 2
    assert "onnxruntime: pip install 'turbotrain[export]'" in one_error_line(err, "export")


# -- error cases: one line, exit code 2 -----------------------------------------------------------
def _hostile_weights(folder: Path) -> dict[str, Path]:
    folder.mkdir(exist_ok=True)
    garbage = folder / "garbage.safetensors"
    garbage.write_bytes(os.urandom(4096))
    huge_header = folder / "huge_header.safetensors"
    huge_header.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    card = ModelCard("compact28", ("a", "b"), 28, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0))
    wrong = folder / "wrong_shapes.safetensors"  # a card for compact28, resnet9's tensors
    from turbotrain.train.models.models import build_model, get_model_spec
    save_weights(wrong, build_model(get_model_spec("resnet9"), 2), card)
    unknown = folder / "unknown_model.safetensors"
    bad_card = ModelCard("os.system", ("a",), 28, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0))
    save_weights(unknown, build_model(get_model_spec("compact28"), 1), bad_card)
    return {"garbage": garbage, "huge_header": huge_header, "wrong_shapes": wrong,
            "unknown_model": unknown}


@pytest.mark.parametrize("case, expected", [
    ("missing run", "--run {tmp}/nope: no such run folder"),
    ("run without weights", "holds no best.safetensors or final.safetensors"),
    ("garbage", "not a readable safetensors file"),
    ("huge_header", "not a readable safetensors file"),
    ("wrong_shapes", "its weights do not fit model compact28 with 2 classes"),
    ("unknown_model", "its card names a model this install cannot build"),
    ("a folder as --weights", "is a folder; pass --run"),
])
@pytest.mark.parametrize("command", ["eval", "predict", "export"])
def test_bad_runs_and_weights_end_in_one_line(fashion, cli, tmp_path, case, expected, command):
    data, _, val_images = fashion
    (tmp_path / "empty").mkdir()
    if case == "missing run":
        source = ["--run", tmp_path / "nope"]
    elif case == "run without weights":
        source = ["--run", tmp_path / "empty"]
    elif case == "a folder as --weights":
        source = ["--weights", tmp_path / "empty"]
    else:
        source = ["--weights", _hostile_weights(tmp_path / "w")[case]]
    image = tmp_path / "x.png"
    Image.fromarray(val_images[0]).save(image)
    rest = {"eval": ["--data", data], "predict": [image],
            "export": ["--format", "safetensors"]}[command]
    code, stdout, err = cli(command, *source, *rest)
    assert code == 2 and stdout == "", (stdout, err)
    assert expected.format(tmp=tmp_path) in one_error_line(err, command)


def test_eval_refuses_a_dataset_of_other_classes(fashion, cli, tiny_dataset, tmp_path):
    code, _, err = cli("eval", "--run", fashion[1], "--data", tiny_dataset,
                       "--out", tmp_path / "eval.json")
    assert code == 2
    assert "its classes are not the model's" in one_error_line(err, "eval")
