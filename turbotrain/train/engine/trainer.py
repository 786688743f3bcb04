"""`train(config)`: the epoch loop around StepEngine, with logging, evaluation and checkpoints.

    from turbotrain.train import TrainConfig, train
    summary = train(TrainConfig(data="OUT", epochs=2))

Timing: data wait is the time blocked in `next(iterator)` (on CUDA: the GPU's idle time before
each batch, from CUDA events; see monitor.py and profiling.py); the rest of a step is compute.
On CUDA the device is synchronised at log points, so each window's wall time is the GPU's too.
Each window is booked once in the run's StepLedger (ledger.py), which keeps the first optimizer
steps of a process (compile, allocator and oneDNN/cuDNN warm-up) and evaluation out of
images/s; the summary and the bottleneck verdict printed at the end (doctor.py) both read it.

What a checkpoint holds of the loop's state (Counters, the ledger) is in trainer_state.py; the
summary `train` returns and writes as summary.json is assembled in run_summary.py.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import signal
import time

import torch

from ..config.config import TrainConfig
from ..errors import DistributedFailure, Interrupted, TrainingDiverged
from ..records import checkpoint as ckpt
from ..records.ledger import StepLedger
from ..records.monitor import RunMonitor
from ..records.progress import Progress
from ..records.report import MetricsLog, plot_curves, write_summary
from ..step.distributed import (all_reduce_sum, barrier, destroy_process_group, dist_env_from_environ,
                                explain_collective_failure, is_collective_failure, max_over_ranks,
                                mean_loss_and_any_stop, report_collective_failures_before_sigterm)
from ..step.loop import evaluate, parameters_finite
from ..weights.keep_best import WeightsKeeper
from .builder import Run, build_run
from .resume_changes import forget_unmet_target
from .run_lines import done_line, evaluation_line, startup_lines
from .run_length import RunLength
from .run_summary import run_summary
from .trainer_state import Counters, checkpoint_state, restore_state

NONFINITE_PATIENCE = 2  # log windows in a row with a non-finite loss before the run stops


class Trainer:
    def __init__(self, run: Run, started: float | None = None):
        self.run = run
        self.main = run.env.is_main
        self.counters = Counters()
        self.ledger = StepLedger()  # where the training time went: summary and verdict
        self.loss_window = torch.zeros((), device=run.device)  # summed on the device
        self.metrics = MetricsLog(run.run_dir, enabled=self.main,
                                  tensorboard=self.config.tensorboard)
        self.progress = Progress(total_steps=run.total_steps, enabled=self.main)
        self.started = time.perf_counter() if started is None else started
        self.process_steps = 0
        # Steps whose time is warm-up: the first eager step builds oneDNN/cuDNN plans; compiled
        # models also compile the backward on the second.
        self.warmup_steps = 2 if run.compiled else 1
        # Step timing (device-honest data wait vs compute), --profile, timeline and verdict.
        self.monitor = RunMonitor(run.device, run.run_dir, warmup_steps=self.warmup_steps,
                                  profile=self.config.profile, writes_files=self.main)
        self._reset_timing_window()
        self.pipeline_state = None
        self.keeper = WeightsKeeper(run)  # best.safetensors, final.safetensors
        self.length = RunLength(run, self.warmup_steps)  # --time-budget, --target-accuracy
        if run.resume_state is not None:
            self._restore(run.resume_state)

    @property
    def config(self) -> TrainConfig:
        return self.run.config  # --time-budget re-plans the epochs (run_length.py)

    # ------------------------------------------------------------------ the run

    def fit(self) -> dict:
        run, c = self.run, self.counters
        for line in startup_lines(self.run, self.config, self.counters):
            self.progress.message(line)
        self.progress.start(c.step)
        outcome = "completed"
        with ckpt.StopRequest() as stop:
            while c.epoch < self.config.epochs and c.step < run.total_steps \
                    and not self.length.reached(c) and not self.length.plateaued(c):
                finished_epoch = self._train_epoch(stop)
                if not finished_epoch:
                    outcome = "max_steps"
                    break
                self._end_epoch()
            if c.step >= run.total_steps and c.step < self.config.epochs * run.steps_per_epoch:
                outcome = "max_steps"
            if c.budget_total_steps >= 0:
                outcome = "time_budget"  # the budget set the run's length
            if self.length.reached(c) and c.step < run.total_steps:
                outcome = "target_accuracy"
            elif self.length.plateaued(c) and c.step < run.total_steps:
                outcome = "early_stop"
            if c.last_eval_step != c.step:
                self._evaluate(record_epoch=False)
                self._checkpoint()
        return self._finish(outcome)

    def _train_epoch(self, stop: ckpt.StopRequest) -> bool:
        """Trains from the current position to the end of the epoch; False when the run's step
        budget ran out first. Checkpoints and exits on SIGTERM/SIGINT."""
        run, c, engine = self.run, self.counters, self.run.engine
        k = self.config.accum_steps
        micro_total = run.steps_per_epoch * k
        pipeline = run.train_pipeline
        pipeline.set_epoch(c.epoch)
        self.monitor.timeline.mark_size(c.step + 1, pipeline.size_at(c.epoch))
        if self.pipeline_state is not None:  # resuming mid-epoch
            pipeline.load_state_dict(self.pipeline_state)
            self.pipeline_state = None
        iterator = iter(pipeline)
        self._reset_timing_window()
        if c.micro_in_epoch == 0:  # not a resume mid-epoch: the monitor marks that apart
            self.monitor.epoch_started(c.step)
        while c.micro_in_epoch < micro_total:
            try:
                with self.monitor.waiting():
                    images, labels = next(iterator)
            except StopIteration:
                break
            will_step = (c.micro_in_epoch + 1) % k == 0
            self.loss_window += engine.micro_step(images, labels, will_step,
                                                  (c.epoch, c.micro_in_epoch))
            c.micro_in_epoch += 1
            self.window_images += labels.shape[0] * run.env.world_size
            if not will_step:
                self.monitor.computed()
                continue
            engine.optimizer_step(c.step)
            c.step += 1
            self.monitor.step_done(c.step)
            c.window_steps += 1
            self.process_steps += 1
            if self.process_steps <= self.warmup_steps:
                self._end_warmup_step()
            fitted = self.length.step_done(c, self.process_steps, self.elapsed, self._sync)
            if fitted is not None:
                self.progress.message(fitted)
            shown = self.length.shown_steps(c)
            if self.progress.total_steps != shown:  # the budget sized the run, or kept time
                self.progress.set_total(shown)
            end_of_epoch = c.micro_in_epoch >= micro_total
            stopping = stop.requested
            if c.step % self.config.log_every == 0 or end_of_epoch or c.step >= run.total_steps:
                stopping = self._log_step(stop.requested)
            elif run.env.enabled:
                # Ranks must stop at the same step (the checkpoint ends in a barrier), so with
                # several a signal is acted on at the next log point, where they agree on it.
                stopping = False
            if stopping:
                self._checkpoint()
                signum = stop.signum or signal.SIGTERM  # None: the signal came to another rank
                name = signal.Signals(signum).name
                raise Interrupted(signum, f"stopped by {name} at step {c.step}; checkpoint "
                                  f"in {run.run_dir}; continue with --out {run.run_dir} --resume")
            if self.config.checkpoint_every and c.step % self.config.checkpoint_every == 0 \
                    and not end_of_epoch:
                self._checkpoint()
            if c.step >= run.total_steps and not end_of_epoch:
                return False
        del iterator
        # A pipeline that ran short mid-accumulation must not leak gradients into next epoch.
        engine.optimizer.zero_grad(set_to_none=True)
        c.micro_in_epoch = micro_total
        return True

    def _end_epoch(self) -> None:
        c = self.counters
        self._evaluate(record_epoch=True)
        c.epoch += 1
        c.micro_in_epoch = 0
        c.epoch_loss_sum = 0.0
        c.epoch_steps = 0
        c.epoch_hits = c.epoch_images = 0
        self._checkpoint()

    # ------------------------------------------------------------------ timing and logging

    def _reset_timing_window(self) -> None:
        self.window_start = time.perf_counter()
        self.window_images = 0
        self.monitor.reset_window()

    def _sync(self) -> None:
        if self.run.device.type == "cuda":
            torch.cuda.synchronize(self.run.device)

    def _end_warmup_step(self) -> None:
        self._sync()
        self.ledger.book_warmup(time.perf_counter() - self.window_start)
        self.counters.images += self.window_images
        self._reset_timing_window()

    def _flush_timing(self) -> tuple[float | None, float | None]:
        """Books the timing window in the ledger; returns its (images/s, data-wait fraction)."""
        self._sync()
        # Wall time less any profiler export; on CUDA the data wait is the GPU's idle time.
        window = self.monitor.flush()
        seconds = window.seconds
        # The slowest rank's loader sets the pace (the others wait for it inside the gradient
        # all-reduce, which counts as compute), so a window's data wait is the largest one.
        data_wait = max_over_ranks(window.data_wait, self.run.env, self.run.device)
        self.ledger.book(window, self.window_images, data_wait)
        self.counters.images += self.window_images
        # None (not 0) for a window that held only warm-up steps: nothing was timed.
        rate = self.window_images / seconds if self.window_images and seconds > 0 else None
        wait = data_wait / seconds if self.window_images and seconds > 0 else None
        self._reset_timing_window()
        return rate, wait

    def elapsed(self) -> float:
        return self.counters.wall_seconds + time.perf_counter() - self.started

    def _epoch_float(self) -> float:
        c = self.counters
        return c.epoch + c.micro_in_epoch / (self.run.steps_per_epoch * self.config.accum_steps)

    def _log_step(self, stop_requested: bool = False) -> bool:
        """Logs the window's metrics (reduced across ranks); returns whether any rank was asked
        to stop (SIGTERM/SIGINT)."""
        c = self.counters
        rate, wait = self._flush_timing()
        loss_sum, stopping = mean_loss_and_any_stop(self.loss_window, stop_requested,
                                                    self.run.env)
        loss = loss_sum / max(1, c.window_steps)
        if torch.isfinite(torch.tensor(loss)):
            c.bad_windows = 0
            c.epoch_loss_sum += loss_sum
            c.epoch_steps += c.window_steps
        else:
            c.bad_windows += 1
            if c.bad_windows >= NONFINITE_PATIENCE or not parameters_finite(self.run.model):
                self._diverged(f"the training loss is {loss} at step {c.step} and stayed "
                               "non-finite")
        self.loss_window.zero_()
        c.window_steps = 0
        self.metrics.write({"kind": "step", "epoch": c.epoch, "epoch_float": self._epoch_float(),
                            "step": c.step, "loss": loss, "lr": self.run.engine.lr(c.step),
                            "train_accuracy": self._train_accuracy(),
                            "images_per_second": rate, "data_wait_fraction": wait,
                            "image_size": self.run.train_pipeline.size_at(c.epoch),
                            **self.run.engine.log_record(),
                            **self.monitor.window_record(), "time": self.elapsed()})
        total = self.length.shown_steps(c)
        self.progress.update(epoch=c.epoch, epochs=math.ceil(total / self.run.steps_per_epoch),
                             step=c.step, loss=loss, images_per_second=rate,
                             data_wait_fraction=wait,
                             eta_seconds=self.ledger.mean_step_seconds * (total - c.step))
        return stopping

    def _train_accuracy(self) -> float | None:
        """The log window's top-1 accuracy on the training batches (augmented, all ranks), read
        here where the loss is read; its counts are added to the epoch's."""
        hits, images = self.run.engine.take_accuracy_counts()
        # Every rank takes part in the all-reduce, whatever it counted.
        counts = torch.tensor([0.0, float(images)], dtype=torch.float64, device=self.run.device)
        if hits is not None:
            counts[0] += hits
        hits, images = all_reduce_sum(counts, self.run.env).tolist()
        self.counters.epoch_hits += int(hits)
        self.counters.epoch_images += int(images)
        return hits / images if images else None

    def _diverged(self, what: str) -> None:
        c = self.counters
        kept = (f"the last good checkpoint (step {c.last_checkpoint_step}) is kept in "
                f"{self.run.run_dir}" if c.last_checkpoint_step >= 0 else "no checkpoint was "
                "written yet")
        raise TrainingDiverged(f"{what}; {kept}. Try a lower --lr, or --precision fp32")

    def _evaluate(self, *, record_epoch: bool) -> None:
        run, c = self.run, self.counters
        self._flush_timing()
        if run.val_pipeline is None:
            c.last_eval_step = c.step
            if record_epoch:
                self._write_epoch_record({})
            return
        result = evaluate(run.model, run.val_pipeline, device=run.device,
                          precision=run.precision, channels_last=run.channels_last, env=run.env,
                          tta=run.config.tta)
        spent = c.eval_seconds
        c.eval_seconds += result.pop("eval_seconds")
        c.previous_val_accuracy = (c.val or {}).get("val_accuracy", -1.0)
        c.val = result
        c.last_eval_step = c.step
        self.keeper.evaluated(c, result)  # the EMA weights' evaluation, when kept, adds to it
        self.monitor.timeline.mark_eval(c.step, c.eval_seconds - spent)
        if record_epoch:
            self._write_epoch_record(result)
        at_size = (f" ({run.train_pipeline.size_at(c.epoch)} px)" if run.config.progressive
                   else "")  # progressive resizing: the size this epoch trained at
        self.progress.message(f"epoch {c.epoch + 1 if record_epoch else self._epoch_float():.3g}"
                              f"{at_size} step {c.step}: val_loss {result['val_loss']:.4f} "
                              f"val_accuracy {result['val_accuracy']:.2%}"
                              + ("" if result["val_top5"] is None else  # <= 5 classes: no top5
                                 f" top5 {result['val_top5']:.2%}"))
        self._reset_timing_window()

    def _write_epoch_record(self, result: dict) -> None:
        c = self.counters
        train_loss = c.epoch_loss_sum / c.epoch_steps if c.epoch_steps else None
        accuracy = c.epoch_hits / c.epoch_images if c.epoch_images else None
        self.metrics.write({"kind": "epoch", "epoch": c.epoch, "epoch_float": c.epoch + 1.0,
                            "step": c.step, "train_loss": train_loss, "train_accuracy": accuracy,
                            "image_size": self.run.train_pipeline.size_at(c.epoch), **result,
                            "time": self.elapsed()})

    # ------------------------------------------------------------------ checkpoints

    def _checkpoint(self) -> None:
        run, c = self.run, self.counters
        self._flush_timing()
        if not parameters_finite(run.model):
            self._diverged(f"the weights became non-finite (nan/inf) by step {c.step}")
        if self.main:
            counters = dataclasses.replace(c, wall_seconds=self.elapsed())
            ckpt.save_atomic(checkpoint_state(run, counters, self.ledger, self.loss_window,
                                              self.monitor.timeline.state_dict()),
                             ckpt.checkpoint_path(run.run_dir))
        c.last_checkpoint_step = c.step
        barrier(run.env)
        self._reset_timing_window()

    def _restore(self, state: dict) -> None:
        """Counters, timing ledger, timeline, RNG, loss window and pipeline position (the
        modules were restored when the run was built); metrics logged after the checkpoint are
        dropped."""
        self.counters, self.ledger, self.loss_window, self.pipeline_state = restore_state(
            self.run, state)
        try:
            self.monitor.resumed(state.get("timeline"), self.counters.step)
        except ckpt.RESTORE_ERRORS as exc:
            raise ckpt.damaged(ckpt.checkpoint_path(self.run.run_dir), exc) from None
        forget_unmet_target(self.counters, self.config.target_accuracy)  # a new one, higher
        self.length.apply(self.counters)  # the length --time-budget fitted, and its schedule
        self.metrics.truncate_after(self.counters.step, self.counters.epoch)

    # ------------------------------------------------------------------ the end

    def _finish(self, outcome: str) -> dict:
        run, c = self.run, self.counters
        ema_result, ema_eval = {}, None
        if run.ema is not None and run.val_pipeline is not None:
            ema_eval = evaluate(run.ema.module, run.val_pipeline, device=run.device,
                                precision=run.precision, channels_last=run.channels_last,
                                env=run.env, tta=run.config.tta)
            ema_result = {"ema_val_loss": ema_eval["val_loss"],
                          "ema_val_accuracy": ema_eval["val_accuracy"],
                          "ema_val_top5": ema_eval["val_top5"]}
            self.progress.message(f"EMA weights: val_accuracy {ema_eval['val_accuracy']:.2%}")
        weights = self.keeper.finish(c, ema_eval if run.ema is not None else c.val)
        self.progress.close()
        stop_record = self.length.stop_record(c, outcome, self._epoch_float())
        if stop_record is not None:
            self.metrics.write({**stop_record, "time": self.elapsed()})
            self.monitor.timeline.stopped = (c.step, stop_record["reason"])
        diagnosis, monitor_files = self.monitor.finish(run, self.ledger)
        if self.main:  # before the clock is read: the figures are the run's time too (~1 s)
            plot_curves(run.run_dir, label_smoothing=run.config.label_smoothing,
                        num_classes=run.num_classes,
                        mixed=bool(run.config.mixup or run.config.cutmix))
        wall = self.elapsed()
        length = self.length.summary(c, outcome, wall)
        summary = run_summary(run, c, self.ledger, outcome=outcome, wall_seconds=wall,
                              ema_result=ema_result, weights=weights, monitor=self.monitor,
                              diagnosis=diagnosis)
        summary.update(length["entries"])
        if self.main:
            lines = length["lines"] + (diagnosis.lines() if diagnosis is not None else [])
            if run.val_pipeline is not None:
                lines.append(evaluation_line(summary))
            for line in lines + [f"wrote {path}" for path in monitor_files]:
                print(line, flush=True)
            write_summary(run.run_dir, summary)
            self.metrics.close()
            print(done_line(c.step, c.val, summary, run.run_dir), flush=True)
        return summary


def train(config: TrainConfig, sources: dict[str, str] | None = None) -> dict:
    """Runs training as `config` says; returns the summary (also written to summary.json).
    `sources`: where each setting came from (config_files.config_and_sources), for the
    decision lines."""
    started = time.perf_counter()
    env = dist_env_from_environ()
    run_dir = config.out
    try:
        with contextlib.ExitStack() as cleanup:
            run = build_run(config, env, cleanup, sources)
            # DDP holds the process group, and its hooks form reference cycles: drop it here and
            # collect it below while the interpreter is alive; left to the exit, Gloo's threads
            # abort it ("terminate called without an active exception", 3 of 16 2-rank runs).
            cleanup.callback(setattr, run.engine, "model", None)
            run_dir = run.run_dir
            trainer = Trainer(run, started)
            cleanup.callback(trainer.metrics.close)
            cleanup.callback(trainer.progress.close)
            cleanup.callback(trainer.monitor.close)
            cleanup.push(report_collective_failures_before_sigterm(env))  # runs first
            return trainer.fit()
    except RuntimeError as exc:
        if not (env.enabled and is_collective_failure(exc)):
            raise
        raise DistributedFailure(explain_collective_failure(exc, env, config.dist_timeout,
                                                            run_dir)) from None
    finally:
        if env.enabled:
            gc.collect()
        destroy_process_group(env)
