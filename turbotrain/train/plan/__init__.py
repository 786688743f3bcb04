"""One plan: every automatic choice of a run, made in one place.

    detect_machine() ──┐   (or Machine.preset("8xh200"): a machine we are not on)
    DatasetFacts.of() ─┼─▶ plan(config, facts, machine, observed) ─▶ Plan: a Decision
    TrainConfig ───────┘        pure: no device, file or global        (value, reason)
                                                                     per setting
    builder.build_run carries a Plan out (and plans again with what it measured: the batch
    search, a pipeline that failed to open); `turbotrain info` prints one; `turbotrain tune`
    varies one.

machine.py  Machine (cores, RAM, GPUs, CPU features, torchrun ranks): a description
hardware.py detect_machine(): the one reader of this machine's CPU and GPUs
device_choice.py  device, precision, compile and memory format, decided from a Machine
facts.py    DatasetFacts (split sizes, image sides, JPEG share, classes, decoded bytes),
            WeightsFacts (what the starting weights' card says)
rules.py    the rule for each setting, with the measurements behind it
core.py     plan(): the rules applied in order; Observed, the measured inputs; Plan;
            plan_loader(): the subset a Loader (train/engine/loader.py) is opened with
"""
from .core import ORDER, Observed, OpenedPipeline, Plan, plan, plan_loader
from .facts import DatasetFacts, WeightsFacts
from .hardware import detect_machine
from .machine import PRESETS, GpuInfo, Machine
from .rules import BatchSearch, Decision

__all__ = ["ORDER", "PRESETS", "BatchSearch", "DatasetFacts", "Decision", "GpuInfo", "Machine",
           "Observed", "OpenedPipeline", "Plan", "WeightsFacts", "detect_machine", "plan",
           "plan_loader"]
