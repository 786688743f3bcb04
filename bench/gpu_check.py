"""The one GPU check: every GPU-only path, checked and timed, with one verdict per goal.

    make gpu-check                                 # = python bench/gpu_check.py --all
    python bench/gpu_check.py --all                # tests + speed + verdicts, <= 8 minutes
    python bench/gpu_check.py                      # the pipeline table alone (budget 330 s)
    python bench/gpu_check.py --wheelhouse DIR     # first pip-installs missing engines from
                                                   # wheels carried in DIR (--no-index)
    python bench/gpu_check.py --smoke [--all]      # CPU, tiny model and images: what the
                                                   # test suite runs (tests/pipeline/test_parity.py)

The GPU box has no internet: the script writes its own data (photo-like 500x375 q90 JPEGs from
turbotrain.datasets.synthetic, encoded with cv2) and installs nothing unless --wheelhouse says
where the wheels are. It says plainly which engines are missing and measures what it can:

* checks: `dali` with ``device="mixed"`` (nvJPEG, and the hardware decoder where present) and
  `ffcv` with ToDevice, `resident` on CUDA: same labels as the CPU path, images within a few
  grey levels; and bench/gpu_device_checks.py's (a CPU run's bf16 flag, DALI's pixels exact,
  no hidden sync in a step of each pipeline, compile after DDP);
* the pipeline table: a ResNet-50 training step at 224 px (bf16 autocast, channels_last,
  torch.compile, fused SGD) fed by each pipeline, against the same step on a synthetic uint8
  batch already on the GPU (the upper bound: no loader at all). The goal is every pipeline
  within 5 % of it. `plain_torchvision_nvjpeg` (bench/gpu_sources.py) is GPU decode without DALI;
* with --all, first `pytest -m cuda`, then `train` itself at its defaults on `resident` and
  `dali` against its own synthetic bound, the `pytorch` pipeline's scaling over the cores,
  torch.compile modes side by side, and a small-data accuracy run (bench/gpu_all.py); it ends
  with one `goal: ... measured ... -> met/MISSED` line per goal of issue 14.

Everything is also written as JSON to --json (default bench/results/gpu_check.json).
Without simplejpeg (not a torch dependency) `pytorch` and `resident` decode through a cv2
stand-in, flagged in the table.
"""
from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))  # gpu_all, gpu_sources (runpy.run_path does not add it)

import common  # noqa: E402
import gpu_all  # noqa: E402
from gpu_device_checks import device_checks  # noqa: E402
from gpu_sources import install_simplejpeg_stand_in, sources  # noqa: E402

ENGINES = {"dali": "nvidia.dali", "ffcv": "ffcv", "simplejpeg": "simplejpeg",
           "torchvision": "torchvision"}
WHEELS = {"dali": "nvidia-dali-cuda130", "ffcv": "ffcv", "simplejpeg": "simplejpeg"}
GOAL = 0.95  # every pipeline within 5 % of the synthetic bound
MODES = ["reduce-overhead", "max-autotune-no-cudagraphs"]  # compared with "default" (--all)


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
    train_steps: int = 60  # --all: optimizer steps of each `train` run (warm-up included)

    @classmethod
    def from_args(cls, args) -> "Settings":
        budget = args.budget_s if args.budget_s is not None else (465.0 if args.all else 330.0)
        if args.smoke:
            return cls("cpu", "resnet18", 32, 8, 48, (64, 48), 1, 2, budget, False, 3)
        return cls("cuda", "resnet50", 224, args.batch_size, args.images, (500, 375),
                   args.warmup, args.steps, budget, True, args.train_steps)


class Report:
    def __init__(self, settings: Settings):
        self.settings, self.started = settings, time.monotonic()
        self.engines: dict[str, str | None] = {}
        self.notes: list[str] = []
        self.checks: list[dict] = []
        self.rows: list[dict] = []
        self.extra: dict = {}  # --all: tests, train_runs, scaling, compile_modes, small_data

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


# -- data and model -------------------------------------------------------------------------------
def write_data(folder: Path, settings: Settings, report: Report):
    from concurrent.futures import ThreadPoolExecutor

    import cv2
    from turbotrain.datasets.beton import layout
    from turbotrain.datasets import open_dataset
    from turbotrain.datasets.synthetic import CLASSES, shape_image
    from turbotrain.datasets.beton.writer import BetonWriter

    def encode(i: int) -> tuple[int, int, bytes]:
        image = shape_image(0, i, i % len(CLASSES), settings.source_size)
        ok, data = cv2.imencode(".jpg", cv2.cvtColor(image, cv2.COLOR_RGB2BGR),
                                [cv2.IMWRITE_JPEG_QUALITY, 90])
        return image.shape[0], image.shape[1], data.tobytes()

    path = folder / "train.beton"
    with ThreadPoolExecutor(max_workers=16) as pool, BetonWriter(path, settings.images) as out:
        for i, (h, w, data) in enumerate(pool.map(encode, range(settings.images))):
            out.append(layout.MODE_JPEG, h, w, data, i % len(CLASSES))
    report.say(f"wrote {settings.images} JPEGs {settings.source_size[0]}x"
               f"{settings.source_size[1]} to {path} ({path.stat().st_size / 1e6:.0f} MB)")
    return open_dataset(path)


def make_step(settings: Settings, mode: str = "default", fused: bool = True):
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
    compiled = torch.compile(model, mode=mode) if settings.compile else model
    cuda = device.type == "cuda"
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9,
                                fused=(cuda and fused) or None, foreach=None if fused else True)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda)

    def step(images, labels):
        with autocast:
            loss = torch.nn.functional.cross_entropy(compiled(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


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


def synthetic_bound(settings: Settings, step) -> float:
    """The step's images/s on one uint8 batch already on the device (compiles in warm-up)."""
    import torch
    device = torch.device(settings.device)
    images = torch.randint(0, 256, (settings.batch_size, settings.image_size,
                                    settings.image_size, 3), dtype=torch.uint8,
                           device=device).permute(0, 3, 1, 2)
    labels = torch.randint(0, 10, (settings.batch_size,), device=device)
    warm = Settings(**{**settings.__dict__, "warmup": max(3, settings.warmup)})
    return timed(iter(lambda: (images, labels), None), warm, step)


# -- the pipeline table ---------------------------------------------------------------------------
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


def pipeline_table(dataset, settings: Settings, report: Report) -> None:
    from turbotrain.pipeline.bench import endless
    step = make_step(settings)
    bound = synthetic_bound(settings, step)
    report.rows.append({"pipeline": "synthetic (on GPU)" if settings.device == "cuda" else
                        "synthetic", "alone": None, "train": bound, "of_bound": 1.0})
    report.say(f"synthetic bound: {bound:,.0f} images/s")
    if settings.device == "cuda":
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
        flag = "" if share is None or share >= GOAL else f"  < {GOAL:.0%}"
        lines.append(f"{row['pipeline']:<22} {alone:>12} {row['train']:>12,.0f} "
                     f"{share:>9.1%}{flag}")
    return "\n".join(lines)


# -- --all ----------------------------------------------------------------------------------------
def run_all(folder: Path, dataset, settings: Settings, report: Report, args) -> None:
    """The stages of bench/gpu_all.py around the pipeline table, most important first; each
    starts only if the budget has room (`--budget-s 1200` measures them all)."""
    data = str(folder / "train.beton")
    steps = settings.train_steps
    cuda = settings.device == "cuda"
    report.extra["train_runs"] = gpu_all.train_defaults(report, folder, data, report.engines,
                                                        steps)
    if report.left() >= gpu_all.COST["scaling"]:
        report.extra["scaling"] = gpu_all.pytorch_scaling(report, dataset, settings)
    if report.left() >= gpu_all.COST["table"]:
        pipeline_table(dataset, settings, report)
    else:
        report.notes.append("the pipeline table: skipped, the time budget is spent")
    if cuda and report.left() >= gpu_all.COST["learn"]:
        report.extra["small_data"] = gpu_all.small_data_learns(report, folder)
    if cuda:  # what --model auto picks from 100,000 images on
        report.extra["large_runs"] = gpu_all.train_defaults(
            report, folder, data, report.engines, steps,
            flags=("--model", "resnet50", "--image-size", "224"), prefix="large",
            pipelines=gpu_all.LARGE_RUNS)

    def step_bound(mode: str, fused: bool) -> float:
        return synthetic_bound(settings, make_step(settings, mode=mode, fused=fused))

    if cuda:
        modes = gpu_all.compile_modes(report, folder, data, steps, report.extra["train_runs"],
                                      args.modes, step_bound)
        bound = next((r["train"] for r in report.rows if r["pipeline"].startswith("synthetic")),
                     None)
        modes["resnet50_step"] = {"default": bound, **modes["resnet50_step"]}
        report.extra["compile_modes"] = modes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    parser.add_argument("--all", action="store_true",
                        help="tests, train at its defaults, scaling, compile modes, verdicts")
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny model/data, few steps")
    parser.add_argument("--images", type=int, default=4096, help="generated JPEGs (4096)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=5, help="untimed batches per measurement")
    parser.add_argument("--steps", type=int, default=30, help="timed batches per measurement")
    parser.add_argument("--train-steps", type=int, default=60,
                        help="--all: optimizer steps per `train` run (default 60)")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="stop starting measurements after this long (default 330 s; "
                             "465 s with --all, which must end within 8 minutes)")
    parser.add_argument("--tests-timeout", type=float, default=200.0,
                        help="--all: seconds for `pytest -m cuda` (default 200; 0 skips it)")
    parser.add_argument("--tests", nargs="+", default=["tests"], metavar="PATH",
                        help="--all: where the CUDA tests are collected (default tests)")
    parser.add_argument("--modes", nargs="*", default=MODES,
                        help=f"--all: compile modes to time against default ({' '.join(MODES)})")
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
    device_checks(report, report.engines, cuda=settings.device == "cuda")
    if args.all and args.tests_timeout > 0:
        timeout = min(args.tests_timeout, max(10.0, report.left() - 120))
        report.extra["tests"] = gpu_all.run_cuda_tests(report, timeout=timeout,
                                                       paths=args.tests)
    with tempfile.TemporaryDirectory() as folder:
        dataset = write_data(Path(folder), settings, report)
        if args.all:
            run_all(Path(folder), dataset, settings, report, args)
        else:
            pipeline_table(dataset, settings, report)
    print("\n" + table(report))
    for note in report.notes:
        print(f"note: {note}")
    seconds = time.monotonic() - report.started
    result = {"device": where, "torch": torch.__version__, "settings": settings.__dict__,
              "engines": report.engines, "rows": report.rows, "checks": report.checks,
              "notes": report.notes, **report.extra, "seconds": seconds,
              "pipeline_goal": GOAL}  # the share of the bound each row must reach
    if args.all:
        result["goals"] = gpu_all.goals(result, report.rows)
        print("\n" + "\n".join(gpu_all.mode_lines(result) + gpu_all.goal_lines(result["goals"])))
    failed = [c["check"] for c in report.checks if not c["ok"]]
    common.write_results(Path(args.json), result)
    print(f"wrote {args.json}; {seconds:.0f} s"
          + (f"; FAILED checks: {', '.join(failed)}" if failed else ""))
    tests_failed = args.all and (result.get("tests") or {}).get("returncode") not in (0, None)
    return 1 if failed or tests_failed else 0


def markdown(result: dict) -> str:
    settings = result["settings"]
    if settings.get("device") != "cuda":
        return "**Not measured** on a GPU: gpu_check.json holds only the CPU smoke run."
    rows = []
    for r in result["rows"]:
        share = r.get("of_bound")
        low = share is not None and share < GOAL and not r["pipeline"].startswith("synthetic")
        rows.append([r["pipeline"], common.rate(r.get("alone")), common.rate(r.get("train")),
                     common.percent(share), f"failed: {r['error']}" if r.get("error") else
                     f"< {GOAL:.0%}" if low else ""])
    return common.markdown(
        f"{result['device']}, torch {result['torch']}: {settings['model']} training at "
        f"{settings['image_size']} px, batch {settings['batch_size']} (bf16, channels_last, "
        "torch.compile) fed by each pipeline, against the same step on a synthetic batch already "
        "on the GPU.",
        common.md_table(["pipeline", "loader alone (images/s)", "training (images/s)",
                         "of synthetic bound", ""], rows),
        common.md_table(["check", "result", "detail"],
                        [[c["check"], "ok" if c["ok"] else "**FAILED**", c["detail"]]
                         for c in result["checks"]]) if result.get("checks") else None,
        [f"- {note}" for note in result.get("notes", [])])


if __name__ == "__main__":
    sys.exit(main())
