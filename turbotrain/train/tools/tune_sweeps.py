"""`tune`'s steps 2 and 3 (tune.py's docstring): the rows measured, each only when what it costs
at least fits in what the budget has left, priced by the rows before it."""
from __future__ import annotations

import time

from turbotrain.pipeline import PipelineError
from turbotrain.pipeline.registry import capabilities

from .tune_report import Row

LOADER_SHARE = 0.35  # of what step 1 leaves: the loader-alone sweep; the model sweep the rest
MAX_MODEL_ROWS = 6  # loader settings re-measured with the model step
WARMUP_BATCHES = 2  # untimed: worker start-up, page cache, allocator, oneDNN plans
LOADER_BATCHES = 3  # timed batches of a loader row, at least
MODEL_STEPS = 3  # timed training steps of a model row, at least
OUT_OF_TIME = "skipped: out of time (raise --budget-seconds)"


def loader_sweep(sweep, rows: list[Row], batch: int, bar, settled=None) -> None:
    """Step 2. A row starts only when its cost at least fits in the time left: what building
    and warming up its pipeline took on an earlier row (before the first, what the pipeline
    declares its first batch costs: FFCV's numba compile), plus LOADER_BATCHES at the rate
    measured there; its timed slice shrinks to what is left. `settled(row)`: True when the
    rows after a measured one cannot matter (tune_levers.compute_bound); they are skipped."""
    share = LOADER_SHARE * sweep.seconds_left()
    loader_slice = max(0.3, share / max(1, len(rows)))
    # Its share, not the whole budget: a first build (FFCV compiles its pipeline) costs what
    # no earlier row foretold, and the model sweep, which decides, keeps the rest.
    ends = time.perf_counter() + share
    guesses: dict[str, float] = {}
    overhead = sweep.overhead
    skip: set[str] = set()
    for i, row in enumerate(rows):
        bar.update(1)
        if row.pipeline in skip:
            row.note = row.note or "skipped: worker count does not apply"
            continue
        guess = guesses.get(row.pipeline)
        fixed = overhead.get(row.pipeline, capabilities(row.pipeline).first_batch_seconds)
        least = fixed + (LOADER_BATCHES * batch / guess if guess else 0.0)
        left = min(sweep.seconds_left(), ends - time.perf_counter())
        if left <= 0 or left < least:
            row.note = OUT_OF_TIME
            continue
        started = time.perf_counter()
        try:
            rate, timed = sweep.loader_rate(row, batch, min(loader_slice, left - fixed),
                                            guess)
        except (PipelineError, ValueError) as exc:
            row.note = f"unavailable: {exc}"
            skip.add(row.pipeline)
            continue
        finally:
            sweep.past_deadline(f"the {row.pipeline} loader row", started)
        row.loader_images_per_second = guesses[row.pipeline] = rate
        # Building, warming up and closing it: what its next row, and its model row, cost
        # beside their timed seconds.
        overhead[row.pipeline] = max(0.0, time.perf_counter() - started - timed)
        if row.note.startswith("no loader workers"):
            skip.add(row.pipeline)  # other worker counts would measure the same
        if settled is not None and settled(row):
            for rest in rows[i + 1:]:
                rest.note = "skipped: compute-bound (below)"
            bar.update(len(rows) - i - 1)
            return


def model_sweep(sweep, measured: list[Row], engine, batch: int, step: float, bar) -> None:
    """Step 3. A row costs at least what building its pipeline took on an earlier row and
    WARMUP_BATCHES + MODEL_STEPS steps at the slower of the model step and the loader
    alone; the time left is shared among the rows still to run."""
    built = dict(sweep.overhead)  # the loader sweep's, until a model row of it measures
    for i, row in enumerate(measured):
        bar.update(1)
        per_step = max(step, batch / row.loader_images_per_second)
        fixed = built.get(row.pipeline, 0.0) + WARMUP_BATCHES * per_step
        left = sweep.seconds_left()
        if left < fixed + MODEL_STEPS * per_step:
            row.note = "model step " + OUT_OF_TIME
            continue
        # Each row still to run costs about this one's fixed part beside its timed slice.
        seconds = max(MODEL_STEPS * per_step, left / (len(measured) - i) - fixed)
        started = time.perf_counter()
        timed = sweep.train_rate(row, engine, batch, seconds)
        sweep.past_deadline(f"the {row.pipeline} model row", started)
        built[row.pipeline] = max(0.0, time.perf_counter() - started - timed
                                  - WARMUP_BATCHES * per_step)


def model_rows(rows: list[Row], pick: str) -> list[Row]:
    """The rows measured with the model: train's own pick first (its fastest loader row), then
    the fastest loaders, MAX_MODEL_ROWS in all."""
    measured = sorted((r for r in rows if r.loader_images_per_second),
                      key=lambda r: -r.loader_images_per_second)
    first = next((r for r in measured if r.pipeline == pick), None)
    measured.sort(key=lambda r: r is not first)
    return measured[:MAX_MODEL_ROWS]


def repeated_epoch(pipeline, epoch: int):
    """`epoch`'s batches over and over (one size of a schedule, timed steadily)."""
    while True:
        pipeline.set_epoch(epoch)
        yield from pipeline


def run_rate(parts: list[tuple[float, float, float]]) -> tuple[float, float]:
    """(images/s, data-wait share) of a run made of `parts`: (its share of the images, images/s,
    data-wait share) at each size. The run's seconds per image are the shares' sum of
    share / rate (a harmonic mean: a slow size weighs by the time it takes), and its wait is
    each part's weighted by its seconds."""
    seconds = [share / rate for share, rate, _ in parts]
    total = sum(seconds)
    return 1.0 / total, sum(s * wait for s, (_, _, wait) in zip(seconds, parts)) / total
