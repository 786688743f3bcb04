"""`turbotrain tune`: the fastest `train` settings for this machine, found in bounded time.

    turbotrain tune --data OUT [--model NAME] [--image-size S] [--device auto|cpu|cuda]
                    [--global-batch-size G] [--pipeline P ...] [--workers W ...]
                    [--budget-seconds 90] [--json]

--budget-seconds bounds the whole command, from the dataset opened to the report: every step
below is paid from it, and a measurement starts only when what it costs at least (measured on
the rows before it: building the pipeline, its warm-up batches, a few training steps) fits in
what is left. On a GPU step 1 (CUDA start-up, cuDNN autotuning) can take a short budget whole;
the report then says so and names train's own pick, unmeasured.

1. The largest micro-batch that fits (batch_finder: real steps with OOM recovery on CUDA, an
   activation-memory estimate on CPU); with --global-batch-size, the largest divisor of it that
   fits, and the accumulation that makes up the rest. Then the trainer's step is timed on
   random pixels (its warm-up: oneDNN/cuDNN plans), which prices the model rows of step 3.
2. Each usable pipeline x worker count, the loader alone (`bench.steady_rate`, images/s),
   train's own pick (`train --pipeline auto`, the plan's) first. When that pick alone loads
   3x what the model step trains, the run is compute-bound: no loader row can change its
   speed, so the sweep stops there (unless --pipeline or --workers chose the rows) and times
   the levers that do instead, a smaller image size, a lighter model, bf16, a couple of steps
   each (tune_levers.py); step 3 is skipped.
3. The fastest loader settings again with the model's training step: the trainer's own
   (loop.make_engine: the GradScaler under fp16, the fused optimizer on CUDA), eager, timed
   by the trainer's own StepClock (compiling would cost most of a budget: ~40-60 s for
   ResNet-50; where train compiles, the report says the step was not timed compiled):
   images/s and the share of the step spent waiting for data. On CPU, torch gets the cores the
   workers leave.
   Under progressive resizing (the plan's, plan/resolution.py) the run trains at several sizes,
   and a step's cost and its data wait change with the size (the model's work with its pixels,
   the loader's much less): each model row is timed at each size of the schedule, the row's
   seconds shared by the epochs at it, and its images/s is the run's, 1 / sum(share / rate)
   (`run_rate`). Steps 1 and 2 stay at the final size: the batch that fits there fits the
   smaller sizes, and the loader alone only ranks pipelines for step 3, which decides.
The best measured row becomes the recommended `train` command; rows within the noise of it
are ties, and train's own pick wins a tie, so tune names another pipeline only when it measured
it faster, and says by how much (tune_report.py).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict

from turbotrain.datasets import DatasetError
from turbotrain.pipeline import PipelineError, build_pipeline, pipeline_names
from turbotrain.pipeline.registry import auto_order
from turbotrain.pipeline.bench import steady_rate

from ..config.config import TrainConfig
from ..engine import batch_finder as bf
from ..engine.data import open_split
from ..errors import TrainError
from ..models.models import build_model
from ..plan import DatasetFacts, Observed, OpenedPipeline, detect_machine, plan, rules
from ..plan.resolution import schedule_of
from ..records.profiling import StepClock
from ..step.device import apply_torch_threads
from ..step.distributed import dist_env_from_environ
from ..step.loop import StepSettings, make_engine
from .tune_levers import compute_bound, time_levers
from .tune_report import Row, against_pick, best_row, format_report, train_command
from .tune_sweeps import (LOADER_BATCHES, MAX_MODEL_ROWS, MODEL_STEPS, WARMUP_BATCHES,
                          loader_sweep, model_rows, model_sweep, repeated_epoch, run_rate)

PROG = "turbotrain tune"
DEFAULT_BUDGET = 90.0  # seconds; a sweep of 3 pipelines x 4 worker counts fits comfortably


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

def eager_note(train_compiles: bool) -> str | None:
    """What the report says when the step it timed is not the one train runs: train compiles
    on CUDA (torch.compile), tune and the batch search run the model eager."""
    if not train_compiles:
        return None
    return ("the model step and the batch search ran eager; train compiles its step "
            "(torch.compile), not timed here: its compute is faster than these rows show, and "
            "a pipeline's data wait may be larger")


class Sweep:
    """Varies train's plan (plan/): the same model, image size, precision and batch rule as
    `train` on this machine, with the pipeline and the workers of each row."""

    def __init__(self, args: argparse.Namespace, machine=None, started: float | None = None):
        import torch

        self.started = time.perf_counter() if started is None else started
        self.budget = args.budget_seconds
        self.deadline = self.started + self.budget  # the whole command's (module docstring)
        self.dataset = open_split(args.data, "train")
        self.facts = DatasetFacts.of(self.dataset)
        self.machine = machine or detect_machine(dist_env_from_environ(),
                                                 gpus=args.device != "cpu")
        # --global-batch-size is batch_plan's: a sweep for speed plans without it (train
        # would also refuse one larger than the split; tune still says how to reach it).
        self.config = TrainConfig(data=str(args.data), model=args.model,
                                  image_size=args.image_size, device=args.device,
                                  precision=args.precision, optimizer=args.optimizer,
                                  order=getattr(args, "order", "auto"))
        self.plan = plan(self.config, self.facts, self.machine)
        self.device = self.plan.device
        self.image_size = self.plan.config.image_size
        # Progressive resizing: the sizes a model row is timed at and the share of the run at
        # each (step 3); {image_size: 1.0} at one size.
        self.schedule = schedule_of(self.plan.config)
        self.size_shares = (self.schedule.shares(self.plan.config.epochs) if self.schedule
                            else {self.image_size: 1.0})
        self.spec = self.plan.spec
        self.precision = self.plan.config.precision
        self.channels_last = self.plan.config.channels_last
        self.cores = self.machine.cores_per_rank
        self.args = args
        self.torch = torch
        self.torch_threads_before = torch.get_num_threads()
        # pipeline -> seconds a row of it takes beside its timed ones (building the pipeline,
        # its warm-up batches, closing it), measured as the sweep goes: what prices the next.
        self.overhead: dict[str, float] = {}
        self.crossed: str | None = None  # what ran past the deadline, for the report
        self.compute_bound: str | None = None  # why the loader sweep stopped early

    def row_plan(self, name: str, workers: int, opened=None):
        """train's plan with `--pipeline name --workers workers` (and, once it is open, what the
        pipeline says about itself: its CPU workers leave torch the other cores)."""
        return plan(self.config.replace(pipeline=name, workers=workers), self.facts,
                    self.machine, Observed(pipeline=opened))

    def seconds_left(self) -> float:
        return self.deadline - time.perf_counter()

    def past_deadline(self, what: str, started: float) -> None:
        """Notes the first step that ended past the deadline: a pipeline's first build (FFCV
        compiles its pipeline, DALI builds its graph) can be measured, not foreseen."""
        if self.crossed is None and self.seconds_left() < 0:
            self.crossed = f"{what} took {time.perf_counter() - started:.1f} s"

    @property
    def pick(self) -> str:
        """The pipeline `train --pipeline auto` takes here: the plan's."""
        return self.plan.config.pipeline

    def build_model(self, spec=None):
        return build_model(spec or self.spec, self.dataset.num_classes, self.dataset.mean,
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

    def build_pipeline(self, name: str, workers: int, batch: int, resolution=None):
        """The row's pipeline at the final size; with `resolution` (the plan's schedule, step 3)
        at each epoch's size."""
        order = self.row_plan(name, workers).config.order  # train's rule for this pipeline
        return build_pipeline(name, self.dataset, train=True, batch_size=batch,
                              image_size=self.image_size, device=self.device, workers=workers,
                              order=order, resolution=resolution)

    def loader_rate(self, row: Row, batch: int, seconds: float, guess: float | None
                    ) -> tuple[float, float]:
        """(images/s of the pipeline alone, the seconds timed); `guess` (images/s) sizes the
        timed batch count."""
        pipeline = self.build_pipeline(row.pipeline, row.workers, batch)
        try:
            if getattr(pipeline, "cpu_workers", None) == 0:
                row.note = "no loader workers (loads in the training process)"
            batches = LOADER_BATCHES + 1 if guess is None else int(seconds * guess / batch)
            batches = max(LOADER_BATCHES, min(batches, 500))
            self.torch.set_num_threads(1)  # like `bench`: the pipeline has its own threads
            rate = steady_rate(pipeline, warmup=WARMUP_BATCHES, batches=batches,
                               device=self.device)
            return rate, batches * batch / rate
        finally:
            pipeline.close()

    # ------------------------------------------------------------------ 3. with the model

    def train_rate(self, row: Row, engine, batch: int, seconds: float) -> float:
        """Images/s and the data-wait share of `engine`'s training steps (loop.make_engine:
        the trainer's step) on the row's pipeline, over `seconds` shared among the schedule's
        sizes (module docstring, step 3) and combined as the run's (`run_rate`); returns the
        seconds timed."""
        pipeline = self.build_pipeline(row.pipeline, row.workers, batch, self.schedule)
        # As in train: cores a loader leaves idle go to torch.
        opened = OpenedPipeline(row.pipeline, len(pipeline), getattr(pipeline, "cpu_workers",
                                                                     None))
        row.threads = self.row_plan(row.pipeline, row.workers, opened).threads.torch_threads
        apply_torch_threads(row.threads)
        timed = []
        try:
            if len(pipeline) == 0:
                raise ValueError("the split has fewer samples than one batch")
            for size, share in self.size_shares.items():
                epoch = (self.schedule.first_epoch_at(size, self.plan.config.epochs)
                         if self.schedule else 0)
                timed.append((share, *self._timed_steps(pipeline, engine, epoch,
                                                        share * seconds)))
        finally:
            pipeline.close()
        row.train_images_per_second, row.data_wait_fraction = run_rate(
            [(share, images / window.seconds, window.data_wait / window.seconds)
             for share, images, window in timed])
        return sum(window.seconds for _, _, window in timed)

    def _timed_steps(self, pipeline, engine, epoch: int, seconds: float):
        """(images, the StepClock's window) of training steps on `epoch`'s batches, repeated,
        for `seconds` after WARMUP_BATCHES (MODEL_STEPS at least, the command's deadline at
        most)."""
        torch = self.torch
        clock = StepClock(self.device)
        images_done, step = 0, 0
        stream = repeated_epoch(pipeline, epoch)
        try:
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
                    now = time.perf_counter()
                    # The row's slice, MODEL_STEPS at least; the command's budget ends it
                    # sooner (a step slower than priced: a loaded box, another thread count).
                    if (now >= deadline and step >= WARMUP_BATCHES + MODEL_STEPS) or \
                            now >= self.deadline:
                        break
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            return images_done, clock.flush()
        finally:
            stream.close()

    def step_settings(self, planned=None):
        """train's step for this plan (loop.StepSettings): its optimizer, precision, label
        smoothing and clipping, one micro-batch per step. The LR is tiny and constant: only the
        speed is measured, on one model for every row. `planned`: a lever's plan instead."""
        planned = planned or self.plan
        return StepSettings.of(planned).replace(
            lr=1e-4, accum_steps=1, weight_decay=planned.config.weight_decay or 0.0)

    def engine(self, planned=None):
        """train's step for this plan (loop.make_engine, as builder.py makes it), or for
        `planned`, a lever's (tune_levers.py)."""
        settings = self.step_settings(planned)
        model = self.build_model(planned.spec if planned else None)
        return make_engine(model.to(self.device, memory_format=settings.memory_format),
                           settings)

    def step_seconds(self, engine, batch: int, image_size: int | None = None) -> float:
        """One training step's seconds at `batch` on random pixels, with train's own thread
        split, after a warm-up step (oneDNN/cuDNN plans, the allocator): what prices a model
        row. Past the deadline it stops after the first step, whose time (warm-up included)
        then overstates a step: rows are skipped, not overrun."""
        torch = self.torch
        size = image_size or self.image_size
        images = torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8,
                               device=self.device)
        labels = torch.randint(0, self.dataset.num_classes, (batch,), device=self.device)
        apply_torch_threads(self.plan.config.threads)
        seconds = 0.0
        for step in range(2):
            started = time.perf_counter()
            engine.micro_step(images, labels, will_step=True)
            engine.optimizer_step(step)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            seconds = time.perf_counter() - started
            if self.seconds_left() <= 0:
                break
        return seconds

    # ------------------------------------------------------------------ all of it

    def rows(self) -> list[Row]:
        """Each pipeline x worker count, train's own pick first (a short budget measures it
        before the others)."""
        names = list(self.args.pipeline or pipeline_names())
        # Train's pick, then auto's order (the fallbacks train would take), then the rest.
        order = [self.pick, *(name for name in auto_order() if name != self.pick)]
        names.sort(key=lambda name: order.index(name) if name in order else len(order))
        counts = self.args.workers or worker_counts(self.cores, self.device.type)
        return [Row(name, w, self._threads_for(w)) for name in names for w in counts]

    def run(self, progress: bool) -> dict:
        from tqdm import tqdm

        started = time.perf_counter()
        plan = self.batch_plan()
        batch = plan["batch_size"]  # at most the split: the search limit is
        self.past_deadline("the batch search", started)
        engine = step = None
        # A search that took the whole budget leaves no row to price: building the model and
        # timing its step (1.5 s here on a 2-core CPU) would only overrun it.
        if self.seconds_left() > 0:
            started = time.perf_counter()
            engine = self.engine()
            step = self.step_seconds(engine, batch)
            self.past_deadline("building the model and timing its step", started)
        rows = self.rows()
        bar = tqdm(total=len(rows) + min(len(rows), MAX_MODEL_ROWS), unit="test", file=sys.stderr,
                   disable=not progress, desc="tune")
        found = []
        try:
            loader_sweep(self, rows, batch, bar,
                         settled=lambda row: self._loaders_settled(row, batch, step))
            if engine is not None:
                if self.compute_bound is None:
                    model_sweep(self, model_rows(rows, self.pick), engine, batch, step, bar)
                else:
                    found = time_levers(self, batch, step)
        finally:
            bar.close()
            self.torch.set_num_threads(self.torch_threads_before)
        best = best_row(rows, self.pick)
        chosen = best or Row(self.pick, self.plan.config.workers, self.plan.config.threads)
        asked = {"model": self.spec.name if self.args.model != "auto" else None,
                 "image-size": self.image_size if self.args.image_size else None,
                 "precision": self.precision if self.args.precision != "auto" else None,
                 "order": None if getattr(self.args, "order", "auto") == "auto"
                 else self.args.order}
        return {"data": str(self.args.data), "images": len(self.dataset),
                "device": str(self.device), "cores": self.cores, "model": self.spec.name,
                "image_size": self.image_size, "precision": self.precision, **plan,
                "size_shares": self.size_shares,
                "step_seconds": step, "budget_seconds": self.budget,
                "eager_note": eager_note(self.plan.config.compile),
                "seconds": time.perf_counter() - self.started, "past_budget": self.crossed,
                "rows": [asdict(r) for r in rows],
                "best": asdict(best) if best else None,
                "train_pick": {"pipeline": self.pick, "reason": self.plan["pipeline"].reason},
                "differs": against_pick(best, rows, self.pick),
                "compute_bound": self.compute_bound,
                "levers": [lever.as_dict() for lever in found],
                "command": train_command(self.args.data, chosen, plan,
                                         device_type=self.device.type, asked=asked)}

    def _loaders_settled(self, row: Row, batch: int, step: float | None) -> bool:
        """Whether train's pick, just measured alone, loads so far beyond the model step that
        no other loader row can matter (tune_levers.py); a sweep the user chose (--pipeline,
        --workers) runs whole."""
        if self.args.pipeline or self.args.workers or row.pipeline != self.pick:
            return False
        self.compute_bound = compute_bound(row.loader_images_per_second, step, batch,
                                           self.pick)
        if self.compute_bound is None:
            return False
        # The loader cannot slow the step: the row trains at the step's own rate.
        row.train_images_per_second, row.data_wait_fraction = batch / step, 0.0
        row.note = (row.note + "; " if row.note else "") + "train img/s: the model step's"
        return True

    def _threads_for(self, workers: int) -> int:
        return self.row_plan("auto", workers).budget.torch_threads


def run_tune(args: argparse.Namespace) -> int:
    started = time.perf_counter()  # --budget-seconds counts from here (module docstring)
    if args.budget_seconds <= 0 or (args.global_batch_size is not None
                                    and args.global_batch_size < 1):
        print(f"{PROG}: error: --budget-seconds and --global-batch-size must be positive",
              file=sys.stderr)
        return 2
    progress = sys.stderr.isatty() if args.progress is None else args.progress
    try:
        result = Sweep(args, started=started).run(progress)
    except (TrainError, DatasetError, PipelineError, ValueError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    print(json.dumps(result, indent=2) if args.json else format_report(result))
    return 0
