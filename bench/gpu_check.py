"""The one GPU check: every GPU-only path, checked and timed, in one table, in <= 6 minutes.

    python bench/gpu_check.py                      # on one GPU (default budget 330 s)
    python bench/gpu_check.py --wheelhouse DIR     # first pip-installs missing engines from
                                                   # wheels carried in DIR (--no-index)
    python bench/gpu_check.py --smoke              # CPU, tiny model and images: what the
                                                   # test suite runs (tests/pipeline/test_parity.py)

The GPU box has no internet: the script writes its own data (photo-like 500x375 q90 JPEGs from
turbotrain.datasets.synthetic, encoded with cv2) and installs nothing unless --wheelhouse says
where the wheels are. It says plainly which engines are missing and measures what it can:

* checks: `dali` with ``device="mixed"`` (nvJPEG, and the hardware decoder where present) and
  `ffcv` with ToDevice, `resident` on CUDA, torchvision's nvJPEG decode: same labels as the CPU
  path, images within a few grey levels;
* speed: a ResNet-50 training step at 224 px (bf16 autocast, channels_last, torch.compile,
  SGD) fed by each pipeline, against the same step on a synthetic uint8 batch already on the
  GPU (the upper bound: no loader at all). The goal is every pipeline within 5 % of it.
  `torchvision-nvjpeg` stands in for GPU decode where DALI is missing: torchvision.io's batched
  ``decode_jpeg(device="cuda")`` plus the shared crop boxes cut and resized on the device.

One table: pipeline, images/s alone (the loader, no model), images/s training, fraction of the
synthetic bound. Also written as JSON to --json (default bench/results/gpu_check.json).
Without simplejpeg (not a torch dependency) `pytorch` and `resident` decode through a cv2
stand-in, flagged in the table.
"""
from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))

ENGINES = {"dali": "nvidia.dali", "ffcv": "ffcv", "simplejpeg": "simplejpeg",
           "torchvision": "torchvision"}
WHEELS = {"dali": "nvidia-dali-cuda130", "ffcv": "ffcv", "simplejpeg": "simplejpeg"}
GOAL = 0.95  # every pipeline within 5 % of the synthetic bound


@dataclass(frozen=True)
class Settings:
    device: str
    model: str
    image_size: int
    batch_size: int
    images: int
    source_size: tuple[int, int]  # (width, height) of the generated JPEGs
    warmup: int
    steps: int
    budget_s: float
    compile: bool

    @classmethod
    def from_args(cls, args) -> "Settings":
        if args.smoke:
            return cls("cpu", "resnet18", 32, 8, 48, (64, 48), 1, 2, args.budget_s, False)
        return cls("cuda", "resnet50", 224, args.batch_size, args.images, (500, 375),
                   args.warmup, args.steps, args.budget_s, True)


class Report:
    def __init__(self, settings: Settings):
        self.settings, self.started = settings, time.monotonic()
        self.engines: dict[str, str | None] = {}
        self.notes: list[str] = []
        self.checks: list[dict] = []
        self.rows: list[dict] = []

    def say(self, line: str) -> None:
        print(f"[{time.monotonic() - self.started:5.0f} s] {line}", flush=True)

    def left(self) -> float:
        return self.settings.budget_s - (time.monotonic() - self.started)

    def check(self, name: str, ok: bool, detail: str) -> None:
        self.checks.append({"check": name, "ok": ok, "detail": detail})
        self.say(f"check {name}: {'ok' if ok else 'FAILED'} ({detail})")


# -- environment ----------------------------------------------------------------------------------
def install_from_wheelhouse(wheelhouse: str, report: Report) -> None:
    missing = [WHEELS[n] for n, module in ENGINES.items()
               if n in WHEELS and importlib.util.find_spec(module.split(".")[0]) is None]
    if not missing:
        return
    command = [sys.executable, "-m", "pip", "install", "--no-index", "--find-links", wheelhouse,
               *missing]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240)
    report.say(f"pip install from {wheelhouse}: {' '.join(missing)} -> exit {done.returncode}")
    if done.returncode:
        report.notes.append(f"wheelhouse install failed: {done.stderr.strip()[-300:]}")
    importlib.invalidate_caches()


def find_engines(report: Report) -> None:
    for name, module in ENGINES.items():
        try:
            imported = importlib.import_module(module)
            report.engines[name] = getattr(imported, "__version__", "installed")
        except ImportError as e:  # absent, or present but broken: both mean "cannot use"
            report.engines[name] = None
            report.notes.append(f"{name} is MISSING ({e}): not measured; carry a "
                                f"{WHEELS.get(name, name)} wheel and pass --wheelhouse DIR")
    present = [f"{n} {v}" for n, v in report.engines.items() if v]
    absent = [n for n, v in report.engines.items() if not v]
    report.say(f"engines present: {', '.join(present) or 'none'}; "
               f"MISSING: {', '.join(absent) or 'none'}")


def install_simplejpeg_stand_in() -> None:
    """A cv2-backed `simplejpeg` module: what `pytorch`/`resident` call, no more."""
    import types

    import cv2
    import numpy as np

    def decode_jpeg(data, colorspace="rgb", fastdct=False, fastupsample=False, min_height=0,
                    min_width=0, min_factor=1.0, buffer=None, strict=True):
        raw = np.frombuffer(memoryview(data), dtype=np.uint8)
        flags = cv2.IMREAD_COLOR
        for factor, reduced in ((8, cv2.IMREAD_REDUCED_COLOR_8), (4, cv2.IMREAD_REDUCED_COLOR_4),
                                (2, cv2.IMREAD_REDUCED_COLOR_2)):
            if min_factor >= factor:
                flags = reduced
                break
        image = cv2.imdecode(raw, flags)
        if image is None:
            raise ValueError("cv2 could not decode the JPEG")
        return cv2.cvtColor(image, cv2.COLOR_BGR2RGB) if colorspace.lower() == "rgb" else image

    def encode_jpeg(image, quality=85, colorspace="rgb", colorsubsampling="420", fastdct=True):
        bgr = cv2.cvtColor(np.ascontiguousarray(image), cv2.COLOR_RGB2BGR)
        return cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, int(quality)])[1].tobytes()

    module = types.ModuleType("simplejpeg")
    module.decode_jpeg, module.encode_jpeg, module.__version__ = decode_jpeg, encode_jpeg, "cv2"
    sys.modules["simplejpeg"] = module


# -- data and model -------------------------------------------------------------------------------
def write_data(folder: Path, settings: Settings, report: Report):
    from concurrent.futures import ThreadPoolExecutor

    import cv2
    from turbotrain.datasets import format as fmt
    from turbotrain.datasets import open_dataset
    from turbotrain.datasets.synthetic import CLASSES, shape_image
    from turbotrain.datasets.writer import BetonWriter

    def encode(i: int) -> tuple[int, int, bytes]:
        image = shape_image(0, i, i % len(CLASSES), settings.source_size)
        ok, data = cv2.imencode(".jpg", cv2.cvtColor(image, cv2.COLOR_RGB2BGR),
                                [cv2.IMWRITE_JPEG_QUALITY, 90])
        return image.shape[0], image.shape[1], data.tobytes()

    path = folder / "train.beton"
    with ThreadPoolExecutor(max_workers=16) as pool, BetonWriter(path, settings.images) as out:
        for i, (h, w, data) in enumerate(pool.map(encode, range(settings.images))):
            out.append(fmt.MODE_JPEG, h, w, data, i % len(CLASSES))
    report.say(f"wrote {settings.images} JPEGs {settings.source_size[0]}x"
               f"{settings.source_size[1]} to {path} ({path.stat().st_size / 1e6:.0f} MB)")
    return open_dataset(path)


def make_step(settings: Settings):
    """step(images uint8 NCHW channels_last, labels) -> None: one SGD step, no host sync."""
    import torch
    import torchvision
    device = torch.device(settings.device)
    net = getattr(torchvision.models, settings.model)(num_classes=1000)
    mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255

    class Stemmed(torch.nn.Module):  # uint8 in, normalised on the device, as our models do
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, images):
            return self.net((images.float() - mean) / std)

    model = Stemmed().to(device, memory_format=torch.channels_last)
    compiled = torch.compile(model) if settings.compile else model
    cuda = device.type == "cuda"
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, fused=cuda or None)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda)

    def step(images, labels):
        with autocast:
            loss = torch.nn.functional.cross_entropy(compiled(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


# -- sources of batches ---------------------------------------------------------------------------
class TorchvisionDecode:
    """GPU-decode stand-in: torchvision.io.decode_jpeg on the device, shared order and boxes."""
    name = "torchvision-nvjpeg"

    def __init__(self, dataset, settings: Settings, seed: int = 0):
        from turbotrain.pipeline.order import SampleOrder
        self.dataset, self.settings, self.seed = dataset, settings, seed
        self.order = SampleOrder(len(dataset), batch_size=settings.batch_size, seed=seed)
        self.epoch = 0

    def __len__(self):
        return len(self.order)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def close(self) -> None:
        pass

    def __iter__(self):
        import numpy as np
        import torch
        import torch.nn.functional as F
        from torchvision.io import ImageReadMode, decode_jpeg
        from turbotrain.pipeline import augment
        device, s, ds = torch.device(self.settings.device), self.settings.image_size, self.dataset
        for indices in self.order.batches(self.epoch):
            data = [torch.from_numpy(np.array(ds.beton.payload(i))) for i in indices]
            decoded = decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
            boxes = augment.crop_boxes(augment.RESIZED_CROP, seed=self.seed, epoch=self.epoch,
                                       indices=indices, heights=ds.heights[indices],
                                       widths=ds.widths[indices], image_size=s)
            out = torch.empty((len(indices), s, s, 3), dtype=torch.uint8, device=device)
            for k, image in enumerate(decoded):
                top, left, h, w, flip = boxes.row(k)
                crop = image[None, :, top:top + h, left:left + w].float()
                crop = F.interpolate(crop, size=(s, s), mode="bilinear", antialias=True)
                crop = crop.round_().clamp_(0, 255).to(torch.uint8)[0]
                out[k] = (crop.flip(-1) if flip else crop).permute(1, 2, 0)
            labels = torch.from_numpy(ds.labels[indices]).to(device, non_blocking=True)
            yield out.permute(0, 3, 1, 2), labels


def sources(dataset, settings: Settings, report: Report):
    """[(name, builder)] of everything that can feed the model here."""
    import torch
    from turbotrain.pipeline import build_pipeline
    device = torch.device(settings.device)
    options = dict(train=True, batch_size=settings.batch_size, image_size=settings.image_size,
                   device=device, seed=0)
    stand_in = "" if report.engines["simplejpeg"] else " (cv2 decode)"
    out = [(n + stand_in, lambda n=n: build_pipeline(n, dataset, **options))
           for n in ("pytorch", "resident")]
    if report.engines["dali"]:
        from turbotrain.pipeline.base import PipelineOptions
        from turbotrain.pipeline.dali import DaliPipeline
        out.append(("dali", lambda: build_pipeline("dali", dataset, **options)))
        if device.type == "cuda":  # default: hardware decoder where present; 0: CUDA only
            out.append(("dali-no-hw-decoder", lambda: DaliPipeline(
                dataset, PipelineOptions(**options), hw_decoder_load=0.0)))
    if report.engines["ffcv"]:
        out.append(("ffcv", lambda: build_pipeline("ffcv", dataset, **options)))
    if report.engines["torchvision"]:
        out.append((TorchvisionDecode.name, lambda: TorchvisionDecode(dataset, settings)))
    return out


def timed(batches, settings: Settings, step=None) -> float:
    """Images/s over settings.steps batches after settings.warmup, with or without training."""
    import torch
    sync = torch.cuda.synchronize if settings.device == "cuda" else (lambda: None)
    for _ in range(settings.warmup):
        images, labels = next(batches)
        if step:
            step(images, labels)
    sync()
    started, count = time.perf_counter(), 0
    for _ in range(settings.steps):
        images, labels = next(batches)
        count += len(labels)
        if step:
            step(images, labels)
    sync()
    return count / (time.perf_counter() - started)


# -- the run --------------------------------------------------------------------------------------
def first_batch(build):
    from turbotrain.pipeline.bench import endless
    with_pipeline = build()
    try:
        return next(iter(endless(with_pipeline)))
    finally:
        with_pipeline.close()


def gpu_checks(dataset, settings: Settings, report: Report) -> None:
    """GPU output vs the CPU path of the same pipeline: same labels, images within 3 levels."""
    import torch
    from turbotrain.pipeline import build_pipeline
    small = dict(train=False, batch_size=16, image_size=settings.image_size, seed=0)
    names = ["resident"] + [n for n in ("dali", "ffcv") if report.engines[n]]
    for name in names:
        try:
            on_gpu = first_batch(lambda: build_pipeline(name, dataset, device=torch.device(
                "cuda"), **small))
            on_cpu = first_batch(lambda: build_pipeline(name, dataset, device=torch.device(
                "cpu"), **small))
        except Exception as e:  # noqa: BLE001 - a check reports any failure and goes on
            report.check(f"{name} on cuda", False, f"{type(e).__name__}: {e}")
            continue
        diff = (on_gpu[0].cpu().float() - on_cpu[0].float()).abs().mean().item()
        same = torch.equal(on_gpu[1].cpu(), on_cpu[1]) and on_gpu[0].is_cuda
        report.check(f"{name} on cuda", same and diff < 3,
                     f"labels {'equal' if same else 'DIFFER'}, mean |GPU - CPU| {diff:.2f}")


def run(settings: Settings, report: Report) -> None:
    import torch

    from turbotrain.pipeline.bench import endless
    with tempfile.TemporaryDirectory() as folder:
        dataset = write_data(Path(folder), settings, report)
        step = make_step(settings)
        device = torch.device(settings.device)
        images = torch.randint(0, 256, (settings.batch_size, settings.image_size,
                                        settings.image_size, 3), dtype=torch.uint8,
                               device=device).permute(0, 3, 1, 2)
        labels = torch.randint(0, 10, (settings.batch_size,), device=device)
        warm = Settings(**{**settings.__dict__, "warmup": max(3, settings.warmup)})
        bound = timed(iter(lambda: (images, labels), None), warm, step)  # compiles in warm-up
        report.rows.append({"pipeline": "synthetic (on GPU)" if device.type == "cuda" else
                            "synthetic", "alone": None, "train": bound, "of_bound": 1.0})
        report.say(f"synthetic bound: {bound:,.0f} images/s")
        if device.type == "cuda":
            gpu_checks(dataset, settings, report)
        for name, build in sources(dataset, settings, report):
            if report.left() < 25:
                report.notes.append(f"{name}: skipped, the time budget is spent")
                continue
            row = {"pipeline": name, "alone": None, "train": None, "of_bound": None}
            try:
                pipeline = build()
                try:
                    row["alone"] = timed(endless(pipeline), settings)
                    row["train"] = timed(endless(pipeline), settings, step)
                    row["of_bound"] = row["train"] / bound
                finally:
                    pipeline.close()
            except Exception as e:  # noqa: BLE001 - one failing engine must not hide the others
                row["error"] = f"{type(e).__name__}: {e}"[:300]
            report.rows.append(row)
            report.say(f"{name}: {row}")


def table(report: Report) -> str:
    lines = [f"{'pipeline':<22} {'alone img/s':>12} {'train img/s':>12} {'of bound':>9}"]
    for row in report.rows:
        if row.get("error"):
            lines.append(f"{row['pipeline']:<22} {'-':>12} {'-':>12} {'-':>9}  {row['error']}")
            continue
        alone = f"{row['alone']:,.0f}" if row["alone"] else "-"
        share = row["of_bound"]
        flag = "" if share is None or share >= GOAL else "  < 95 %"
        lines.append(f"{row['pipeline']:<22} {alone:>12} {row['train']:>12,.0f} "
                     f"{share:>9.1%}{flag}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny model/data, few steps")
    parser.add_argument("--images", type=int, default=4096, help="generated JPEGs (4096)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=5, help="untimed batches per measurement")
    parser.add_argument("--steps", type=int, default=30, help="timed batches per measurement")
    parser.add_argument("--budget-s", type=float, default=330.0,
                        help="stop starting measurements after this long (default 330 s)")
    parser.add_argument("--wheelhouse", default=None, help="folder of wheels to install from")
    parser.add_argument("--json", default=str(ROOT / "results" / "gpu_check.json"))
    args = parser.parse_args(argv)
    settings = Settings.from_args(args)
    report = Report(settings)
    import torch
    if settings.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; use --smoke for the CPU smoke run", file=sys.stderr)
        return 2
    if args.wheelhouse:
        install_from_wheelhouse(args.wheelhouse, report)
    find_engines(report)
    if not report.engines["simplejpeg"]:
        install_simplejpeg_stand_in()
        report.notes.append("pytorch/resident decode with a cv2 stand-in for simplejpeg")
    where = torch.cuda.get_device_name() if settings.device == "cuda" else "cpu (smoke)"
    report.say(f"torch {torch.__version__} on {where}; {settings}")
    run(settings, report)
    print("\n" + table(report))
    for note in report.notes:
        print(f"note: {note}")
    failed = [c["check"] for c in report.checks if not c["ok"]]
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(
        {"device": where, "torch": torch.__version__, "settings": settings.__dict__,
         "engines": report.engines, "rows": report.rows, "checks": report.checks,
         "notes": report.notes, "seconds": time.monotonic() - report.started}, indent=2))
    print(f"wrote {args.json}; {time.monotonic() - report.started:.0f} s"
          + (f"; FAILED checks: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
