"""Lightning's `Trainer.fit` with `TurbotrainDataModule` vs `train`, same data, model, precision.

    .venv/bin/python bench/bench_lightning.py [--images 3000] [--image-size 64] [--batch-size 64]
        [--steps 40] [--rounds 4] [--model airbench] [--precision auto] [--profile]

The data, the `train` side, the settings and the timing are bench_loader.py's (photo set,
`pytorch` pipeline, one untimed warm-up step, fresh processes, interleaved rounds with the
order swapped every round, the ratio the median of the rounds' ratios). The `lightning` side is a LightningModule around the same model (`build_model`,
channels_last) whose `training_step` is forward + cross-entropy, the same SGD, and
`Trainer(accelerator="cpu", devices=1, max_steps=..., precision="32-true" or "bf16-mixed")`
without logger, progress bar, checkpointing or validation (what `train --checkpoint-every 0`
on a split without val does too), freed host memory kept as `train` keeps it. Its images/s is
the timed steps' images over the wall time from the end of the warm-up step to the end of the
last (a Callback's on_train_batch_end), so Lightning's hooks, its optimizer wrapping and the
data wait all count.

Goal: lightning / train >= 0.9x. Below it (or with --profile), one more run under Lightning's
SimpleProfiler records where the fit's time went (its actions' totals, in the JSON and the
report). Writes bench/results/lightning.json.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results" / "lightning.json"
sys.path.insert(0, str(ROOT))

import bench_loader  # noqa: E402  (the data, the train side, the settings)
import common  # noqa: E402

GOAL = 0.9
PROFILE_ACTIONS = 10  # the profiler's largest actions kept


def run_lightning(data: Path, args, profile: bool = False) -> dict:
    import lightning.pytorch as L
    import torch
    from lightning.pytorch.profilers import SimpleProfiler
    from turbotrain.lightning import TurbotrainDataModule
    from turbotrain.train.step.host_memory import keep_freed_memory
    keep_freed_memory()
    datamodule = TurbotrainDataModule(data, batch_size=args.batch_size,
                                      image_size=args.image_size, pipeline="pytorch",
                                      workers=args.workers, threads=args.threads,
                                      val_split=None)
    datamodule.setup("fit")  # the model needs the classes; fit's own setup finds it open
    net = bench_loader.build_model(datamodule.train_loader, args.model)
    timer = _step_timer(bench_loader.WARMUP_STEPS, args.steps)
    profiler = SimpleProfiler() if profile else None
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=args.steps,
                        precision="bf16-mixed" if args.precision == "bf16" else "32-true",
                        logger=False, enable_progress_bar=False, enable_checkpointing=False,
                        enable_model_summary=False, limit_val_batches=0,
                        num_sanity_val_steps=0, callbacks=[timer], profiler=profiler)
    started = time.perf_counter()
    trainer.fit(_module(net), datamodule=datamodule)
    fit_seconds = time.perf_counter() - started
    result = {"images_per_second": (args.steps - bench_loader.WARMUP_STEPS) * args.batch_size
              / timer.seconds, "torch_threads": torch.get_num_threads()}
    if profiler is not None:
        totals = {action: sum(times) for action, times in profiler.recorded_durations.items()}
        largest = sorted(totals.items(), key=lambda item: -item[1])[:PROFILE_ACTIONS]
        result["profile"] = {"fit_seconds": fit_seconds, "actions": dict(largest)}
    return result


def _module(net):
    """A LightningModule around `net` (classes made here: the parent never imports Lightning)."""
    import lightning.pytorch as L
    import torch

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = net

        def training_step(self, batch, batch_idx):
            images, labels = batch
            return torch.nn.functional.cross_entropy(self.net(images), labels)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9, nesterov=True,
                                   weight_decay=5e-4)
    return Module()


def _step_timer(first: int, last: int):
    """A Callback timing from the end of step `first` to the end of step `last`."""
    import lightning.pytorch as L

    class StepTimer(L.Callback):
        start = end = None

        def on_train_batch_end(self, trainer, *rest):
            if trainer.global_step == first:
                self.start = time.perf_counter()
            elif trainer.global_step == last:
                self.end = time.perf_counter()

        @property
        def seconds(self) -> float:
            return self.end - self.start
    return StepTimer()


def profile_once(data: Path, argv_settings: list[str]) -> dict:
    """One more run under SimpleProfiler (the module docstring)."""
    run = common.run_child([Path(__file__), "--child", "lightning-profile", "--data", data,
                            *argv_settings])
    return {"profile": run.get("profile"), "profile_error": run.get("error")}


def main(argv: list[str] | None = None) -> int:
    parser = bench_loader.parser_for(__doc__, default_steps=40)
    parser.add_argument("--profile", action="store_true",
                        help="also profile one fit whatever the ratio (SimpleProfiler)")
    args = parser.parse_args(argv)
    if args.child == "lightning":
        common.print_result(run_lightning(args.data, args))
        return 0
    if args.child == "lightning-profile":
        common.print_result(run_lightning(args.data, args, profile=True))
        return 0
    if args.child:
        common.print_result(bench_loader.child(args))
        return 0

    def extra(result: dict, data: Path) -> dict:
        below = result["ratio"] is None or result["ratio"] < GOAL
        if not (below or args.profile):
            return {}
        return profile_once(data, bench_loader.settings_args(args))
    result = bench_loader.compare(args, argv, name="lightning", ours="lightning", goal=GOAL,
                                  child_script=__file__, results=RESULTS, extra=extra)
    for action, seconds in ((result.get("profile") or {}).get("actions") or {}).items():
        print(f"  {seconds:8.3f} s  {action}")
    return 0


def markdown(result: dict) -> str:
    profile = result.get("profile")
    if profile:
        where = [f"Where the fit's {profile['fit_seconds']:.1f} s went (Lightning's "
                 "SimpleProfiler, one more run; nested actions include their children):",
                 common.md_table(["action", "seconds"], [[f"`{action}`", f"{seconds:.3f}"]
                                 for action, seconds in profile["actions"].items()])]
    else:
        where = [f"The profiled run failed: {result['profile_error']}"
                 if result.get("profile_error") else None]
    return common.markdown(*bench_loader.against_train(
        result, "lightning", "Lightning's `Trainer.fit` with `TurbotrainDataModule` (no logger, "
        "progress bar or checkpoints)"), *where)


if __name__ == "__main__":
    sys.exit(main())
