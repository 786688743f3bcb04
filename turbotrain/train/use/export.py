"""`turbotrain export`: a trained model as one file to deploy, checked against the eager model.

    turbotrain export --run RUNDIR --format onnx            # RUNDIR/model.onnx
    turbotrain export --weights FILE --format torchscript --out model.pt
    turbotrain export --run RUNDIR --format safetensors     # RUNDIR/model.safetensors

Every format holds the whole `Classifier`, its input stem included: the input is uint8 RGB
pixels, NCHW (batch, 3, S, S) with S the card's input size (its eval_size: the run's
evaluation resolution, plan/eval_rules.py; else its image_size), prepared as `predict` prepares an
image (prepare-dataset's storage, then the eval centre crop or, for <= 64 px images, a resize),
any batch size; the output is float32 logits (batch, classes). Normalisation is inside.

The card (in every format) also states that preparation under "preprocessing" (weights.py:
the resize and centre-crop rule of pipeline/augment.eval_rule, and whether the run averaged
each image's logits with its mirror's: flip TTA, which a deployment repeats by running the file
on both), and export prints it.

* safetensors: the weights and the card (model, classes, image size, mean/std): what `eval`,
  `predict` and `train --init-from` read. Tensors only: loading it runs no code.
* torchscript: `torch.jit.trace` (PyTorch deprecates TorchScript; prefer ONNX for new
  deployments): `torch.jit.load(FILE)(images)`; the card is the file's extra file card.json.
* onnx: `torch.onnx.export`'s torch.export-based exporter (opset 18, onnxscript), falling back
  to the TorchScript-based one for a net the new one cannot capture; input "images", output
  "logits", a dynamic "batch" axis; the card is in the model's metadata (key "turbotrain").
  Needs `pip install turbotrain[export]` (onnx, onnxruntime, onnxscript).

The file is written in a private temporary folder beside its destination (safe_create: nothing
planted there is written through), loaded back and run (ONNX through onnxruntime) on
a real batch: the first images of the run's dataset (val split, else train) through the eval
pipeline, else `--images`, else seeded random pixels; its logits are compared with the eager
fp32 model's and the largest absolute difference is printed. Above the tolerance the command
fails with exit code 1 and writes nothing; below it the file is renamed into place. An existing
file there is replaced only with --overwrite (checked before the export starts, and again,
atomically, when the file is renamed into place).

Tolerance: TOLERANCE x max(1, largest |logit|). Both sides compute in fp32 (machine epsilon
1.2e-7) but in different orders (onnxruntime's MLAS kernels and fusions, oneDNN in eager):
measured on compact28, airbench and resnet18 the differences were 3e-8 to 3e-7 at logit
scales of 0.05 to 0.6, i.e. below 1e-6 relative. 1e-4 relative leaves 100x headroom for deeper
nets and other CPUs, while what a broken export does (a stem without normalisation, BatchNorm
in training mode, swapped channels, a baked-in batch size) changes logits by 1e-2 to 1 relative.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from turbotrain.datasets.remote.urls import is_url
from turbotrain.datasets.sources.image_files import list_images
from turbotrain.files.safe_create import existing_refusal, replacing_path
from turbotrain.pipeline import build_pipeline
from turbotrain.pipeline.registry import streaming_cpu_pipeline
from turbotrain.printable import printable

from ..engine.data import open_split, open_val_split
from ..errors import TrainError
from ..weights.weights import ModelCard, load_classifier, save_weights
from .inference import LoadedModel, add_model_arguments, describe, load_model, run_command
from .predict import Inputs, load_batch

PROG = "turbotrain export"
FORMATS = {"safetensors": "safetensors", "torchscript": "torchscript.pt", "onnx": "onnx"}
TOLERANCE = 1e-4
CHECK_BATCH = 16   # images compared; never EXAMPLE_BATCH, so a baked-in batch size shows
EXAMPLE_BATCH = 2  # the batch traced / exported (dynamic afterwards)
ONNX_OPSET = 18
ONNX_PACKAGES = ("onnx", "onnxruntime", "onnxscript")


class ExportMismatch(RuntimeError):
    """The exported model's logits differ from the eager model's beyond the tolerance."""

    exit_code = 1


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser, runtime=False)
    parser.add_argument("--format", choices=list(FORMATS), required=True,
                        help="safetensors (weights + card), torchscript or onnx")
    parser.add_argument("--out", metavar="FILE",
                        help="the exported file (default: model.<format> in the run folder, "
                             "or beside the --weights file); an existing file is refused "
                             "unless --overwrite")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing exported file")
    parser.add_argument("--data", metavar="DS",
                        help="prepared dataset whose first images check the export (default: "
                             "the run's)")
    parser.add_argument("--images", nargs="+", metavar="IMAGE",
                        help="image files to check the export on when no dataset is at hand")


def run_export(args: argparse.Namespace) -> int:
    try:
        return run_command(PROG, _run, args)
    except ExportMismatch as exc:
        print(f"{PROG}: error: {printable(exc)}", file=sys.stderr)
        return exc.exit_code


def _run(args: argparse.Namespace) -> int:
    if args.format == "onnx":
        missing = [name for name in ONNX_PACKAGES if importlib.util.find_spec(name) is None]
        if missing:
            raise TrainError(f"--format onnx needs {', '.join(missing)}: "
                             "pip install 'turbotrain[export]'")
    # Exported models run in fp32 on the CPU, and are checked so.
    loaded = load_model(args, device="cpu", precision="fp32")
    model = loaded.model.to(memory_format=torch.contiguous_format).eval()
    out = Path(args.out) if args.out else \
        (loaded.run_dir or loaded.path.parent) / f"model.{FORMATS[args.format]}"
    if os.path.lexists(out) and not args.overwrite:
        raise TrainError(existing_refusal(out, "--overwrite"))
    batch, where = check_batch(loaded, args)
    print(printable(describe(loaded)))
    started = time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        with replacing_path(out, overwrite=args.overwrite) as tmp:
            how, difference, tolerance = _export_and_check(args.format, model, loaded, tmp,
                                                           batch, where)
    except FileExistsError:  # one that appeared while we exported
        raise TrainError(existing_refusal(out, "--overwrite")) from None
    card = loaded.card
    print(printable(f"exported {out} ({args.format}, {how}) in "
                    f"{time.perf_counter() - started:.1f} s: images uint8 [batch, 3, "
                    f"{card.input_size}, {card.input_size}] -> logits float32 "
                    f"[batch, {card.num_classes}]"))
    print(printable(f"checked on {where}: largest |logit difference| {difference:.3g} "
                    f"(tolerance {tolerance:.3g})"))
    rule = card.preprocessing  # also in the file's card, under "preprocessing"
    print(printable(f"preprocessing (the card's \"preprocessing\"): {rule['photos']}; "
                    f"{rule['small images']}; {rule['input']}; test-time augmentation: "
                    f"{rule['tta']}"))
    return 0


def _export_and_check(fmt: str, model, loaded: LoadedModel, path: Path, batch: torch.Tensor,
                      where: str) -> tuple[str, float, float]:
    """Writes the export to path and compares its logits on batch with the model's; returns
    (how, largest difference, tolerance), or raises ExportMismatch."""
    how, run_exported = EXPORTERS[fmt](model, loaded, path)
    with torch.no_grad():
        expected = model(batch)
        got = torch.as_tensor(run_exported(batch))
    if got.shape != expected.shape:
        raise ExportMismatch(f"the exported model gives logits of shape {tuple(got.shape)} "
                             f"for {len(batch)} images, the model {tuple(expected.shape)}")
    difference = float((got.float() - expected).abs().max())
    tolerance = TOLERANCE * max(1.0, float(expected.abs().max()))
    if not difference <= tolerance:  # also a NaN
        raise ExportMismatch(f"the exported model's logits differ from the model's by up "
                             f"to {difference:.3g} on {where}, over the tolerance "
                             f"{tolerance:.3g}; nothing written")
    return how, difference, tolerance


def check_batch(loaded: LoadedModel, args) -> tuple[torch.Tensor, str]:
    """uint8 (n, 3, S, S) images to compare on, n != EXAMPLE_BATCH, and what they are."""
    size = loaded.card.input_size
    images, where = None, ""
    data = args.data
    if not data and loaded.settings.get("data"):
        # A run folder may be a stranger's: what it names is shown before it is read, and a
        # URL in it is never fetched (eval's rule, docs/SECURITY.md).
        data = loaded.settings["data"]
        if is_url(data):
            data = None
        else:
            print(printable(f"data: {data} (from {loaded.run_dir / 'config.yaml'}; --data "
                            "chooses another)"))
    if data and (is_url(data) or Path(data).exists()):
        images, where = _dataset_images(loaded, data)
    if images is None and args.images:
        images, where = _file_images(loaded, args.images)
    if images is None:
        generator = torch.Generator().manual_seed(0)
        images = torch.randint(0, 256, (CHECK_BATCH, 3, size, size), dtype=torch.uint8,
                               generator=generator)
        where = f"{CHECK_BATCH} random images (no dataset or --images to check on)"
    if len(images) == EXAMPLE_BATCH:
        images = torch.cat([images, images[:1]])
    return images.contiguous(), where


def _dataset_images(loaded: LoadedModel, data) -> tuple[torch.Tensor, str]:
    """The first CHECK_BATCH images of the val split (else train) through the eval pipeline:
    the first in auto's order that runs on a CPU with nothing optional installed and decodes
    batch by batch (the pytorch pipeline: holding the decoded split would decode all of it
    for one batch)."""

    split = open_val_split(data)[0]
    if split is None:
        split = open_split(data, "train")
    name = streaming_cpu_pipeline()
    pipeline = build_pipeline(name, split, train=False, batch_size=CHECK_BATCH,
                              image_size=loaded.card.input_size, device=torch.device("cpu"),
                              workers=1)
    try:
        images, _ = next(iter(pipeline))
    finally:
        pipeline.close()
    return images, f"{len(images)} images of {data}/{split.split}"


def _file_images(loaded: LoadedModel, paths) -> tuple[torch.Tensor, str]:

    inputs = Inputs([list_images(p) for p in paths])
    batch = load_batch(inputs, range(min(len(inputs), CHECK_BATCH)), loaded.card.input_size)
    for i, reason in batch.errors:
        raise TrainError(f"--images: {inputs.name(i)}: {reason}")
    return batch.images.permute(0, 3, 1, 2), f"{len(batch.indices)} of the --images"


# -- the formats: each writes `path` and returns (how, a function running the written file) ----
def export_safetensors(model, loaded: LoadedModel, path: Path):
    card = loaded.card
    info = {**card.info, "exported_from": str(loaded.path)}
    save_weights(path, model, dataclasses.replace(card, info=info))
    reloaded, _ = load_classifier(path, "cpu")
    return "weights + card", reloaded


def export_torchscript(model, loaded: LoadedModel, path: Path):
    example = _example(loaded)
    with warnings.catch_warnings():
        # torch.jit is deprecated (FutureWarning); tracing still works, and the check below
        # runs the traced file on another batch size than the one traced.
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(model, example, check_trace=False)
        torch.jit.save(traced, str(path), _extra_files={"card.json": loaded.card.to_json()})
        reloaded = torch.jit.load(str(path), map_location="cpu")
    return "torch.jit.trace", reloaded


def export_onnx(model, loaded: LoadedModel, path: Path):
    import onnx
    import onnxruntime
    example = _example(loaded)
    names = dict(input_names=["images"], output_names=["logits"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            batch = torch.export.Dim("batch", min=1, max=1 << 20)
            torch.onnx.export(model, (example,), str(path), dynamo=True, verbose=False,
                              opset_version=ONNX_OPSET, dynamic_shapes={"images": {0: batch}},
                              external_data=False, **names)
            how = f"torch.export-based exporter, opset {ONNX_OPSET}"
        except Exception as exc:  # noqa: BLE001 - any capture failure: try the older exporter
            reason = _first_line(exc)
            try:
                torch.onnx.export(model, (example,), str(path), dynamo=False,
                                  opset_version=ONNX_OPSET, **names,
                                  dynamic_axes={"images": {0: "batch"}, "logits": {0: "batch"}})
            except Exception as legacy:  # noqa: BLE001 - both failed: say why, in one line
                raise TrainError(f"torch.onnx cannot export {loaded.card.model}: {reason}; "
                                 f"the TorchScript-based exporter: {_first_line(legacy)}"
                                 ) from None
            how = (f"TorchScript-based exporter, opset {ONNX_OPSET} (the torch.export-based "
                   f"one failed: {reason})")
    proto = onnx.load(str(path))
    entry = proto.metadata_props.add()
    entry.key, entry.value = "turbotrain", loaded.card.to_json()
    onnx.save(proto, str(path))
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    declared = session.get_inputs()[0]
    if declared.type != "tensor(uint8)" or isinstance(declared.shape[0], int):
        raise ExportMismatch(f"the ONNX model's input is {declared.type} {declared.shape}, "
                             "expected uint8 with a dynamic batch axis")

    def run(images: torch.Tensor) -> np.ndarray:
        return session.run(["logits"], {declared.name: images.numpy()})[0]
    return how, run


EXPORTERS = {"safetensors": export_safetensors, "torchscript": export_torchscript,
             "onnx": export_onnx}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


def _example(loaded: LoadedModel) -> torch.Tensor:
    size = loaded.card.input_size
    generator = torch.Generator().manual_seed(1)
    return torch.randint(0, 256, (EXAMPLE_BATCH, 3, size, size), dtype=torch.uint8,
                         generator=generator)
