"""`turbotrain tune`: the fastest `train` settings for this machine, found in bounded time.

    turbotrain tune --data OUT [--model NAME] [--image-size S] [--device auto|cpu|cuda]
                    [--global-batch-size G] [--pipeline P ...] [--workers W ...]
                    [--budget-seconds 90] [--json]

--budget-seconds bounds steps 2 and 3; step 1 comes first and is not counted (on a GPU it is
CUDA start-up, cuDNN autotuning and a few trial steps: seconds that a short budget would
otherwise spend before the first pipeline is measured).

1. The largest micro-batch that fits (batch_finder: real steps with OOM recovery on CUDA, an
   activation-memory estimate on CPU); with --global-batch-size, the largest divisor of it that
   fits, and the accumulation that makes up the rest.
2. Each usable pipeline x worker count, the loader alone (`bench.steady_rate`, images/s).
3. The fastest loader settings again with the model's training step: the trainer's own
   (loop.make_engine: the GradScaler under fp16, the fused optimizer on CUDA), eager (`train`
   may compile, which only speeds the compute side), timed by the trainer's own StepClock:
   images/s and the share of the step spent waiting for data. On CPU, torch gets the cores the
   workers leave.
The best measured row becomes the recommended `train` command.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass

from turbotrain.datasets import DatasetError
from turbotrain.pipeline import PipelineError, build_pipeline, pipeline_names
from turbotrain.pipeline.bench import endless, steady_rate

from ..config.config import TrainConfig
from ..engine import batch_finder as bf
from ..engine.data import open_split
from ..errors import TrainError
from ..models.models import build_model
from ..plan import DatasetFacts, Machine, Observed, OpenedPipeline, plan, rules
from ..records.profiling import StepClock
from ..step.device import apply_torch_threads
from ..step.distributed import dist_env_from_environ
from ..step.loop import StepSettings, make_engine

PROG = "turbotrain tune"
DEFAULT_BUDGET = 90.0  # seconds; a sweep of 3 pipelines x 4 worker counts fits comfortably
LOADER_SHARE = 0.35  # of the budget: the loader-alone sweep; the model sweep gets the rest
MAX_MODEL_ROWS = 6  # loader settings re-measured with the model step
WARMUP_BATCHES = 2  # untimed: worker start-up, page cache, allocator, oneDNN plans
# Run-to-run spread of a few-second images/s measurement on the shared 2-core dev box: ~3 %.
NOISE = 0.03


@dataclass
class Row:
    pipeline: str
    workers: int
    threads: int  # torch intra-op threads during the model step
    loader_images_per_second: float | None = None
    train_images_per_second: float | None = None
    data_wait_fraction: float | None = None
    note: str = ""


def add_tune_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", required=True, help="prepared dataset folder (prepare-dataset's OUT)")
    p.add_argument("--model", default="auto", help="model to tune for (default: train's choice)")
    p.add_argument("--image-size", type=int, default=None,
                   help="training resolution (default: train's choice)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--precision", choices=("auto", "fp32", "bf16", "fp16"), default="auto")
    p.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd")
    p.add_argument("--global-batch-size", type=int, default=None,
                   help="images per optimizer step to reach (sets --accum-steps)")
    p.add_argument("--pipeline", nargs="+", choices=pipeline_names(), default=None, metavar="P",
                   help="pipelines to try (default: every one that can run here)")
    p.add_argument("--workers", nargs="+", type=int, default=None, metavar="W",
                   help="worker counts to try (default: from the cores)")
    p.add_argument("--order", choices=("auto", "random", "quasi-random"), default="auto",
                   help="training sample order, as train's --order (default: train's choice)")
    p.add_argument("--budget-seconds", type=float, default=DEFAULT_BUDGET,
                   help=f"time for the whole sweep (default {DEFAULT_BUDGET:.0f})")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar (default: when stderr is a terminal)")


def worker_counts(cores: int, device_type: str) -> list[int]:
    """A few splits of the cores: on CPU the model needs the rest, on CUDA the loader has all
    but the launching thread's."""
    if device_type == "cuda":
        counts = {max(1, cores // 4), max(1, cores // 2), max(1, cores - 1)}
    else:
        counts = {1, max(1, cores // 4), max(1, cores // 2), max(1, cores - 1)}
    return sorted(counts)


# ---------------------------------------------------------------------------- the sweep

class Sweep:
    """Varies train's plan (plan/): the same model, image size, precision and batch rule as
    `train` on this machine, with the pipeline and the workers of each row."""

    def __init__(self, args: argparse.Namespace, machine=None):
        import torch

        self.started = self.sweep_started = time.perf_counter()
        self.budget = max(1.0, args.budget_seconds)
        self.dataset = open_split(args.data, "train")
        self.facts = DatasetFacts.of(self.dataset)
        self.machine = machine or Machine.detect(dist_env_from_environ())
        # --global-batch-size is batch_plan's: a sweep for speed plans without it (train
        # would also refuse one larger than the split; tune still says how to reach it).
        self.config = TrainConfig(data=str(args.data), model=args.model,
                                  image_size=args.image_size, device=args.device,
                                  precision=args.precision, optimizer=args.optimizer,
                                  order=getattr(args, "order", "auto"))
        self.plan = plan(self.config, self.facts, self.machine)
        self.device = self.plan.device
        self.image_size = self.plan.config.image_size
        self.spec = self.plan.spec
        self.precision = self.plan.config.precision
        self.channels_last = self.plan.config.channels_last
        self.cores = self.machine.cores_per_rank
        self.args = args
        self.torch = torch
        self.torch_threads_before = torch.get_num_threads()

    def row_plan(self, name: str, workers: int, opened=None):
        """train's plan with `--pipeline name --workers workers` (and, once it is open, what the
        pipeline says about itself: its CPU workers leave torch the other cores)."""
        return plan(self.config.replace(pipeline=name, workers=workers), self.facts,
                    self.machine, Observed(pipeline=opened))

    def seconds_left(self) -> float:
        return self.budget - (time.perf_counter() - self.sweep_started)

    def build_model(self):
        return build_model(self.spec, self.dataset.num_classes, self.dataset.mean,
                           self.dataset.std)

    # ------------------------------------------------------------------ 1. batch

    def batch_plan(self) -> dict:
        """The plan's batch search (train's, leaving the same room for the resident store),
        reported up to MAX_BATCH (or the global batch) rather than up to train's preferred
        batch; the recommendation is what train's rule makes of the answer (batch_from_fit),
        with --global-batch-size the largest divisor of it and the accumulation."""
        search, target = self.plan.batch_search, self.args.global_batch_size
        if target:
            search = rules.batch_search(preferred=(target, ""), global_batch=target,
                                        world_size=1, count=len(self.dataset),
                                        reserve_bytes=search.reserve_bytes)
        fit = bf.find_batch_size(self.build_model, self.step_settings(),
                                 num_classes=self.dataset.num_classes,
                                 image_size=self.image_size,
                                 limit=min(target or bf.MAX_BATCH, len(self.dataset)),
                                 reserve_bytes=search.reserve_bytes)
        batch = rules.batch_from_fit(search, fit, count=len(self.dataset), model=self.spec.name,
                                     image_size=self.image_size).value
        accum = rules.accum_for_global_batch(target, 1, batch, 1).value if target else 1
        return {"largest_fitting": fit.batch_size, "search_limit": fit.limit, "how": fit.how,
                "reserve_bytes": search.reserve_bytes, "batch_size": batch,
                "accum_steps": accum}

    # ------------------------------------------------------------------ 2. loader alone

    def build_pipeline(self, name: str, workers: int, batch: int):
        order = self.row_plan(name, workers).config.order  # train's rule for this pipeline
        return build_pipeline(name, self.dataset, train=True, batch_size=batch,
                              image_size=self.image_size, device=self.device, workers=workers,
                              order=order)

    def loader_rate(self, row: Row, batch: int, seconds: float, guess: float | None) -> float:
        """Images/s of the pipeline alone; `guess` (images/s) sizes the timed batch count."""
        pipeline = self.build_pipeline(row.pipeline, row.workers, batch)
        try:
            if getattr(pipeline, "cpu_workers", None) == 0:
                row.note = "no loader workers (loads in the training process)"
            batches = 4 if guess is None else int(seconds * guess / batch)
            batches = max(3, min(batches, 500))
            self.torch.set_num_threads(1)  # like `bench`: the pipeline has its own threads
            return steady_rate(pipeline, warmup=WARMUP_BATCHES, batches=batches,
                               device=self.device)
        finally:
            pipeline.close()

    # ------------------------------------------------------------------ 3. with the model

    def train_rate(self, row: Row, engine, batch: int, seconds: float) -> None:
        """Images/s and the data-wait share of `engine`'s training steps (loop.make_engine:
        the trainer's step) on the row's pipeline, timed by the trainer's StepClock."""

        torch = self.torch
        pipeline = self.build_pipeline(row.pipeline, row.workers, batch)
        # As in train: cores a loader leaves idle go to torch.
        opened = OpenedPipeline(row.pipeline, len(pipeline), getattr(pipeline, "cpu_workers",
                                                                     None))
        row.threads = self.row_plan(row.pipeline, row.workers, opened).threads.torch_threads
        apply_torch_threads(row.threads)
        clock = StepClock(self.device)
        images_done, step = 0, 0
        stream = endless(pipeline)
        try:
            if len(pipeline) == 0:
                raise ValueError("the split has fewer samples than one batch")
            deadline = None
            while True:
                if step == WARMUP_BATCHES:
                    if self.device.type == "cuda":
                        torch.cuda.synchronize(self.device)
                    clock.reset()
                    deadline = time.perf_counter() + seconds
                with clock.waiting():
                    images, labels = next(stream)
                engine.micro_step(images, labels, will_step=True)
                engine.optimizer_step(step)
                step += 1
                clock.computed(step)
                if step > WARMUP_BATCHES:
                    images_done += labels.shape[0]
                    if time.perf_counter() >= deadline and step >= WARMUP_BATCHES + 3:
                        break
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            window = clock.flush()
        finally:
            stream.close()
            pipeline.close()
        row.train_images_per_second = images_done / window.seconds
        row.data_wait_fraction = window.data_wait / window.seconds

    def step_settings(self):
        """train's step for this plan (loop.StepSettings): its optimizer, precision, label
        smoothing and clipping, one micro-batch per step. The LR is tiny and constant: only the
        speed is measured, on one model for every row."""
        return StepSettings.of(self.plan).replace(
            lr=1e-4, accum_steps=1, weight_decay=self.plan.config.weight_decay or 0.0)

    def engine(self):
        """train's step for this plan (loop.make_engine, as builder.py makes it)."""
        settings = self.step_settings()
        model = self.build_model().to(self.device, memory_format=settings.memory_format)
        return make_engine(model, settings)

    # ------------------------------------------------------------------ all of it

    def run(self, progress: bool) -> dict:
        from tqdm import tqdm

        plan = self.batch_plan()
        self.sweep_started = time.perf_counter()  # the budget is the sweep's (module docstring)
        batch = plan["batch_size"]  # at most the split: the search limit is
        names = self.args.pipeline or pipeline_names()
        counts = self.args.workers or worker_counts(self.cores, self.device.type)
        rows = [Row(name, w, self._threads_for(w)) for name in names for w in counts]
        bar = tqdm(total=len(rows) + min(len(rows), MAX_MODEL_ROWS), unit="test", file=sys.stderr,
                   disable=not progress, desc="tune")
        loader_slice = max(0.3, LOADER_SHARE * self.seconds_left() / max(1, len(rows)))
        guesses: dict[str, float] = {}
        skip: set[str] = set()
        for row in rows:
            bar.update(1)
            if row.pipeline in skip:
                row.note = row.note or "skipped: worker count does not apply"
                continue
            if self.seconds_left() <= 0:
                row.note = "skipped: out of time (raise --budget-seconds)"
                continue
            try:
                row.loader_images_per_second = self.loader_rate(row, batch, loader_slice,
                                                                guesses.get(row.pipeline))
                guesses[row.pipeline] = row.loader_images_per_second
                if row.note.startswith("no loader workers"):
                    skip.add(row.pipeline)  # other worker counts would measure the same
            except (PipelineError, ValueError) as exc:
                row.note = f"unavailable: {exc}"
                skip.add(row.pipeline)
        measured = sorted((r for r in rows if r.loader_images_per_second),
                          key=lambda r: -r.loader_images_per_second)[:MAX_MODEL_ROWS]
        engine = self.engine()
        try:
            for i, row in enumerate(measured):
                bar.update(1)
                left = self.seconds_left()
                if left <= 0 and i > 0:
                    row.note = "model step skipped: out of time"
                    continue
                self.train_rate(row, engine, batch,
                                max(0.5, left / (len(measured) - i)))
        finally:
            bar.close()
            self.torch.set_num_threads(self.torch_threads_before)
        best = _best(rows)
        return {"data": str(self.args.data), "images": len(self.dataset),
                "device": str(self.device), "cores": self.cores, "model": self.spec.name,
                "image_size": self.image_size, "precision": self.precision, **plan,
                "seconds": time.perf_counter() - self.started,
                "rows": [asdict(r) for r in rows],
                "best": asdict(best) if best else None,
                "command": self.command(best, plan) if best else None}

    def _threads_for(self, workers: int) -> int:
        return self.row_plan("auto", workers).budget.torch_threads

    def command(self, best: Row, plan: dict) -> str:
        parts = ["turbotrain train", f"--data {self.args.data}", f"--pipeline {best.pipeline}",
                 f"--workers {best.workers}"]
        if self.device.type == "cpu":
            parts.append(f"--threads {best.threads}")
        if self.args.model != "auto":
            parts.append(f"--model {self.spec.name}")
        if self.args.image_size:
            parts.append(f"--image-size {self.image_size}")
        if self.args.precision != "auto":
            parts.append(f"--precision {self.precision}")
        if getattr(self.args, "order", "auto") != "auto":
            parts.append(f"--order {self.args.order}")
        parts.append(f"--batch-size {plan['batch_size']}")
        if plan["accum_steps"] > 1:
            parts.append(f"--accum-steps {plan['accum_steps']}")
        return " ".join(parts)


def _best(rows: list[Row]) -> Row | None:
    """The fastest with the model; rows within NOISE of it are ties, broken by the lower data
    wait (more headroom when the model gets faster: bf16, compile) and then fewer workers."""
    timed = [r for r in rows if r.train_images_per_second]
    if not timed:
        return None
    fastest = max(r.train_images_per_second for r in timed)
    ties = [r for r in timed if r.train_images_per_second >= (1 - NOISE) * fastest]
    return min(ties, key=lambda r: (r.data_wait_fraction or 0.0, r.workers))


# ---------------------------------------------------------------------------- output

def format_report(result: dict) -> str:
    lines = [f"tune {result['data']}: {result['images']} images, {result['model']} at "
             f"{result['image_size']} px, {result['precision']}, {result['device']} "
             f"({result['cores']} cores), {result['seconds']:.0f} s",
             f"largest micro-batch that fits: {result['largest_fitting']}"
             + (" (the search limit)" if result["largest_fitting"] >= result["search_limit"]
                else "") + f"; {result['how']}",
             "",
             f"{'pipeline':<12} {'workers':>7} {'threads':>7} {'loader img/s':>13} "
             f"{'train img/s':>12} {'data wait':>10}  note"]
    for r in result["rows"]:
        loader = r["loader_images_per_second"]
        train = r["train_images_per_second"]
        wait = r["data_wait_fraction"]
        lines.append(f"{r['pipeline']:<12} {r['workers']:>7} {r['threads']:>7} "
                     f"{f'{loader:,.0f}' if loader else '-':>13} "
                     f"{f'{train:,.0f}' if train else '-':>12} "
                     f"{f'{wait:.0%}' if wait is not None else '-':>10}  {r['note']}")
    lines.append("")
    timed = [r for r in result["rows"] if r["train_images_per_second"]]
    if len(timed) > 1:
        rates = [r["train_images_per_second"] for r in timed]
        if max(rates) < 1.1 * min(rates) and all(r["data_wait_fraction"] < 0.2 for r in timed):
            lines.append("every loader keeps up (within 10 %, < 20 % data wait): the model step "
                         "is the limit here; see `turbotrain info` for precision/compile")
    if result["command"]:
        lines.append(f"recommended: {result['command']}")
    else:
        lines.append("no setting could be measured with the model; raise --budget-seconds")
    return "\n".join(lines)


def run_tune(args: argparse.Namespace) -> int:
    if args.budget_seconds <= 0 or (args.global_batch_size is not None
                                    and args.global_batch_size < 1):
        print(f"{PROG}: error: --budget-seconds and --global-batch-size must be positive",
              file=sys.stderr)
        return 2
    progress = sys.stderr.isatty() if args.progress is None else args.progress
    try:
        result = Sweep(args).run(progress)
    except (TrainError, DatasetError, PipelineError, ValueError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    print(json.dumps(result, indent=2) if args.json else format_report(result))
    return 0
