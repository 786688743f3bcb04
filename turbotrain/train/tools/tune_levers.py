"""`tune` on a compute-bound run: when train's own loader alone serves several times what the
model step trains, no pipeline or worker count can change the run's speed (issue 46: 95 s of
sweeping to recommend what `auto` picks). tune then stops sweeping loaders and times, on the
model step, the levers that do change it: a smaller image size, a lighter model, bf16, each a
couple of steps on random pixels, and says what they change besides the speed."""
from __future__ import annotations

from dataclasses import asdict, dataclass

from ..plan import plan

# The pick's loader alone at this multiple of the model step's images/s: a step this much
# faster (bf16 and compile together rarely give more) would still not wait for data.
LOADER_HEADROOM = 3.0
SMALLER_SIDE = 0.75  # the image-size lever: 0.56x the pixels, hence about the FLOPs
MIN_LEVER_SIDE = 16
# The lighter model the model lever tries: 4.5x fewer FLOPs (resnet50 -> 18); airbench has
# 2.6x fewer than ResNet-9 (plan/rules.py's reasons).
LIGHTER = {"resnet50": "resnet18", "resnet18": "airbench"}
ACCURACY_NOTE = "changes what the model learns: check the accuracy"


@dataclass
class Lever:
    flag: str  # the train flag, e.g. "--image-size 48"
    changes: dict  # TrainConfig fields for the plan
    step_seconds: float | None = None
    speedup: float | None = None  # the base step's seconds / this one's
    note: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def compute_bound(loader_rate: float | None, step_seconds: float | None, batch: int,
                  pick: str) -> str | None:
    """Why the loader sweep can stop after train's pick was measured (None: it goes on)."""
    if not loader_rate or not step_seconds or step_seconds <= 0:
        return None
    model_rate = batch / step_seconds
    if loader_rate < LOADER_HEADROOM * model_rate:
        return None
    return (f"compute-bound: {pick} alone loads {loader_rate:,.0f} images/s, "
            f"{loader_rate / model_rate:.0f}x what the model step trains ({model_rate:,.0f}): no "
            "pipeline or worker count changes this run's speed")


def levers(*, model: str, image_size: int, precision: str, any_size: bool, device_type: str,
           bf16_capable: bool) -> list[Lever]:
    """The settings that change a compute-bound step, for this plan (described state)."""
    found = []
    smaller = max(MIN_LEVER_SIDE, int(image_size * SMALLER_SIDE) // 8 * 8)
    if any_size and smaller < image_size:
        found.append(Lever(f"--image-size {smaller}", {"image_size": smaller, "model": model}))
    lighter = LIGHTER.get(model)
    if lighter is not None:
        found.append(Lever(f"--model {lighter}", {"model": lighter, "image_size": image_size}))
    if precision == "fp32" and (bf16_capable or device_type == "cuda"):
        found.append(Lever("--precision bf16", {"precision": "bf16", "model": model,
                                                "image_size": image_size}))
    return found


def time_levers(sweep, batch: int, base_step: float) -> list[Lever]:
    """The levers of `sweep`'s plan (tune.Sweep), each step timed while its budget lasts.
    Where train compiles its step, tune times it eager: the ratio is eager's, and says so."""
    spec, device = sweep.spec, sweep.device
    found = levers(model=spec.name, image_size=sweep.image_size, precision=sweep.precision,
                   any_size=spec.any_size and spec.conv, device_type=device.type,
                   bf16_capable=sweep.machine.cpu_bf16 if device.type == "cpu" else True)
    eager = bool(sweep.plan.config.compile)
    for lever in found:
        if sweep.seconds_left() < 3 * base_step:
            lever.note = "skipped: out of time (raise --budget-seconds)"
            continue
        planned = plan(sweep.config.replace(**lever.changes), sweep.facts, sweep.machine)
        engine = sweep.engine(planned)
        lever.step_seconds = sweep.step_seconds(engine, batch, planned.config.image_size)
        lever.speedup = base_step / lever.step_seconds if lever.step_seconds > 0 else None
        lever.note = ("eager; " if eager else "") + (
            ACCURACY_NOTE if "precision" not in lever.changes
            else "bf16 autocast: accuracy usually within noise of fp32")
    return found


def report_lines(result: dict) -> list[str]:
    """The report's lines about a compute-bound run (none otherwise)."""
    why = result.get("compute_bound")
    if not why:
        return []
    lines = [why + "; the levers that do, timed on the model step:"]
    for lever in result.get("levers", []):
        speed = (f"{lever['speedup']:.2f}x the step's speed" if lever["speedup"] else "not timed")
        lines.append(f"  `{lever['flag']}`: {speed} ({lever['note']})")
    if not result.get("levers"):
        lines.append("  none here: nothing to change within seconds")
    return lines
