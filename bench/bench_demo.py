"""`turbotrain demo` end to end, and `train --time-budget` honoured on three budgets (issue 32).

    .venv/bin/python bench/bench_demo.py                    # demo + budgets 30 s, 60 s, 120 s
    .venv/bin/python bench/bench_demo.py --budgets 30       # a quicker smoke
    .venv/bin/python bench/bench_demo.py --skip-demo --data DIR/prepared --settings-from DIR/run

1. `turbotrain demo --out DIR/demo` in a fresh process: its total time (writing and preparing
   the images included), its training time (summary.json's wall_seconds) and val accuracy.
   Goals: training <= 120 s, val accuracy >= 95 %.
2. `turbotrain train --time-budget B` for each budget on the demo's prepared dataset (a small
   prepared set: 3,000 + 500 images) with the demo's image size, model and precision (read from
   the demo run's config.yaml), each in a fresh process, a fresh run folder. Goal: the training
   time within +-10 % of B; the accuracy reached at each budget is recorded beside it.

A benchmark, not a test: it times wall-clock work on every core, so run it on a quiet machine
(about 2 + 3.5 minutes on the 2-core dev box). Writes bench/results/demo.json.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common

RESULTS = common.ROOT / "results" / "demo.json"
DEMO_TRAIN_GOAL_S = 120.0  # issue 32: the demo's training on the 2-core box
DEMO_ACCURACY_GOAL = 0.95
BUDGET_TOLERANCE = 0.10  # --time-budget honoured within +-10 %
DEFAULT_BUDGETS = (30.0, 60.0, 120.0)
# From the demo run's config.yaml: what the budget runs share with it.
SHARED_SETTINGS = ("image_size", "model", "precision")  # config.yaml spells them image-size...


def turbotrain(*args: str, timeout: float) -> float:
    """`python -m turbotrain ARGS` to its end in a fresh process; its seconds. Its output is
    streamed (a run of minutes shows its progress)."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "turbotrain", *args], cwd=common.REPO,
                          timeout=timeout)
    if done.returncode:
        raise RuntimeError(f"turbotrain {' '.join(args[:2])} exited {done.returncode}")
    return time.perf_counter() - started


def read_summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def read_settings(run_dir: Path) -> dict:
    """The demo run's image size, model and precision, from its config.yaml (flat YAML)."""
    import yaml  # a dependency of turbotrain's config files
    config = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    values = {k: config.get(k.replace("_", "-"), config.get(k)) for k in SHARED_SETTINGS}
    return {k: v for k, v in values.items() if v not in (None, "auto")}


def run_demo(out: Path) -> dict:
    load = common.load_average()
    total = turbotrain("demo", "--out", str(out), timeout=1800)
    summary = read_summary(out / "run")
    train_s = summary["wall_seconds"]
    return {"total_seconds": round(total, 1), "train_seconds": round(train_s, 1),
            "val_accuracy": summary["val_accuracy"], "epochs": summary["epochs"],
            "images_per_second": summary["images_per_second"],
            "precision": summary["precision"], "model": summary["model"],
            "image_size": summary["image_size"],
            "time_budget_seconds": summary.get("time_budget_seconds"),
            "budget_reason": summary.get("budget_reason"), "outcome": summary.get("outcome"),
            "target_accuracy": summary.get("target_accuracy"),
            "target_reached_epoch": summary.get("target_reached_epoch"), "load": load}


def run_budget(data: Path, out: Path, budget: float, settings: dict) -> dict:
    load = common.load_average()
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in settings.items()]
    total = turbotrain("train", "--data", str(data), "--out", str(out),
                       f"--time-budget={budget:g}s", *flags, timeout=budget * 3 + 300)
    summary = read_summary(out)
    used = summary["wall_seconds"]
    return {"budget_seconds": budget, "train_seconds": round(used, 1),
            "process_seconds": round(total, 1), "used_fraction": round(used / budget, 3),
            "val_accuracy": summary["val_accuracy"], "epochs": summary["epochs"],
            "steps": summary["steps"], "budget_reason": summary.get("budget_reason"),
            "flags": flags, "load": load}


def goals(demo: dict | None, budgets: list[dict]) -> list[dict]:
    out = []
    if demo:
        out.append({"what": "demo training time", "goal_seconds": DEMO_TRAIN_GOAL_S,
                    "seconds": demo["train_seconds"],
                    "met": demo["train_seconds"] <= DEMO_TRAIN_GOAL_S})
        out.append(common.ratio_goal("demo val accuracy / 95 %",
                                     demo["val_accuracy"] / DEMO_ACCURACY_GOAL, 1.0))
    for b in budgets:
        low, high = (b["budget_seconds"] * (1 + s * BUDGET_TOLERANCE) for s in (-1, 1))
        out.append({"what": f"--time-budget {b['budget_seconds']:g}s: training in "
                            f"{low:.0f}-{high:.0f} s", "goal_seconds": high,
                    "seconds": b["train_seconds"], "met": low <= b["train_seconds"] <= high})
    return out


def summary_line(demo: dict | None, budgets: list[dict]) -> str:
    parts = []
    if demo:
        parts.append(f"demo: training {demo['train_seconds']:.0f} s, val accuracy "
                     f"{100 * demo['val_accuracy']:.1f} %, total {demo['total_seconds']:.0f} s")
    parts += [f"budget {b['budget_seconds']:g} s: used {b['train_seconds']:.1f} s "
              f"({100 * b['used_fraction']:.0f} %), val accuracy {100 * b['val_accuracy']:.1f} %"
              for b in budgets]
    return "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--budgets", type=float, nargs="*", default=list(DEFAULT_BUDGETS),
                        help="--time-budget values in seconds (default: 30 60 120)")
    parser.add_argument("--work", type=Path, default=None,
                        help="folder for the demo and the runs (default: a temporary one)")
    parser.add_argument("--skip-demo", action="store_true",
                        help="only the budgets, on --data (a prepared dataset)")
    parser.add_argument("--data", type=Path, default=None,
                        help="with --skip-demo: the prepared dataset the budgets train on")
    parser.add_argument("--settings-from", type=Path, default=None, metavar="RUN",
                        help="with --skip-demo: a demo run folder whose image size, model and "
                             "precision the budgets use (default: train's own)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.skip_demo and args.data is None:
        parser.error("--skip-demo needs --data DIR (a prepared dataset)")
    with tempfile.TemporaryDirectory(prefix="bench_demo_") as tmp:
        work = args.work or Path(tmp)
        demo, data = None, args.data
        settings = read_settings(args.settings_from) if args.settings_from else {}
        try:
            if not args.skip_demo:
                demo = run_demo(work / "demo")
                settings = read_settings(work / "demo" / "run")
                data = work / "demo" / "prepared"
            budgets = [run_budget(data, work / f"budget-{b:g}s", b, settings)
                       for b in args.budgets]
        except (RuntimeError, OSError, KeyError, subprocess.TimeoutExpired) as exc:
            print(f"bench_demo: error: {exc}", file=sys.stderr)
            return 1
    report = {"command": common.command_line(__file__, argv), "demo": demo,
              "budget_settings": settings, "budgets": budgets,
              "goals": goals(demo, budgets)}
    common.write_results(args.out, report)
    print(summary_line(demo, budgets))
    print(f"wrote {args.out}")
    return 0


def markdown(result: dict) -> str:
    demo, budgets = result["demo"], result["budgets"]
    budget = demo.get("time_budget_seconds")
    ending = (f"; it stopped at epoch {demo['target_reached_epoch']}, the first to reach its "
              f"{common.percent(demo['target_accuracy'])} target (time budget {budget:g} s)"
              if demo.get("outcome") == "target_accuracy" else
              f"; it ran to its {budget:g} s time budget" if budget else "")
    flags = " ".join(budgets[0].get("flags") or []) if budgets else ""
    return common.markdown(
        f"`turbotrain demo`, end to end in a fresh process: training **{demo['train_seconds']} "
        f"s** ({demo['model']} at {demo['image_size']} px, {demo['precision']}, "
        f"{demo['epochs']} epochs), val accuracy **{common.percent(demo['val_accuracy'])}**, "
        f"{demo['total_seconds']} s in all with writing and preparing the images{ending}.",
        f"`train --time-budget B` on the demo's prepared dataset ({flags}), each in a fresh "
        "process:",
        common.md_table(["budget", "training time", "used", "epochs", "val accuracy"],
                        [[f"{b['budget_seconds']:g} s", f"{b['train_seconds']} s",
                          common.percent(b.get("used_fraction")), b.get("epochs"),
                          common.percent(b.get("val_accuracy"))] for b in budgets]))


if __name__ == "__main__":
    sys.exit(main())
