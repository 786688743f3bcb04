"""Where would early stopping have ended these runs, and what would it have cost? (issue 46)

    python bench/early_stop_curves.py --data OUT [--data OUT2 ...] [--epochs 10] [--seeds 0 1]
    python bench/early_stop_curves.py --runs RUNDIR [RUNDIR ...]     # curves already trained

Trains each dataset x seed with `train --epochs N --no-early-stop` (every epoch, the default
cosine schedule), or reads finished run folders, and replays each learning curve through
plan/early_stop.py's `stop_reason` (the rule `train` applies) and through plainer patience
rules without its LR guard, printing for each rule the epoch it would stop at and the val
accuracy given up against the run's best. Accuracy curves are deterministic under a seed, so
this is a measurement a loaded machine can make: only the wall time would be noisy, and it is
not used.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from turbotrain.train.plan import early_stop  # noqa: E402


def curve(run_dir: Path) -> tuple[list[float], list[float]]:
    """(val accuracy after each epoch, the LR's share of its peak at each epoch's end)."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
               if line.strip()]
    steps = [r for r in records if r["kind"] == "step"]
    peak = max(r["lr"] for r in steps)
    accuracies, shares = [], []
    for r in records:
        if r["kind"] == "epoch" and r.get("val_accuracy") is not None:
            accuracies.append(r["val_accuracy"])
            last = [s for s in steps if s["step"] <= r["step"]][-1]
            shares.append(last["lr"] / peak)
    return accuracies, shares


def replay(accuracies: list[float], shares: list[float], rule) -> int:
    """The 1-based epoch after which `rule(epochs_done, best_epoch, best, lr_share)` stops the
    run (the last epoch when it never does)."""
    best, best_epoch = -1.0, 0
    for epoch, (accuracy, share) in enumerate(zip(accuracies, shares), start=1):
        if accuracy > best:
            best, best_epoch = accuracy, epoch
        if epoch < len(accuracies) and rule(epoch, best_epoch, best, share):
            return epoch
    return len(accuracies)


def rules() -> dict:
    def ours(done, best_epoch, best, share):
        return early_stop.stop_reason(epochs_done=done, best_epoch=best_epoch,
                                      best_accuracy=best, lr_share=share) is not None

    def plain(patience):
        return lambda done, best_epoch, best, share: best >= 1.0 or done - best_epoch >= patience

    return {"ours": ours, "patience 1": plain(1), "patience 2": plain(2), "patience 3": plain(3)}


def train(data: str, epochs: int, seed: int, out: Path) -> Path:
    run_dir = out / f"{Path(data).name}-e{epochs}-s{seed}"
    if not (run_dir / "summary.json").is_file():
        subprocess.run([sys.executable, "-m", "turbotrain", "train", "--data", data, "--out",
                        str(run_dir), "--epochs", str(epochs), "--seed", str(seed),
                        "--no-early-stop"], cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    return run_dir


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--data", nargs="*", default=[])
    p.add_argument("--runs", nargs="*", default=[], type=Path)
    p.add_argument("--epochs", type=int, default=early_stop.DEFAULT_EPOCHS)
    p.add_argument("--seeds", nargs="*", type=int, default=[0])
    p.add_argument("--out", type=Path, default=REPO / "bench" / ".cache" / "early-stop")
    args = p.parse_args(argv)
    runs = list(args.runs) + [train(d, args.epochs, s, args.out) for d in args.data
                              for s in args.seeds]
    for run_dir in runs:
        accuracies, shares = curve(run_dir)
        best = max(accuracies)
        print(f"{run_dir.name}: " + " ".join(f"{a:.3f}" for a in accuracies))
        for name, rule in rules().items():
            stop = replay(accuracies, shares, rule)
            given_up = best - max(accuracies[:stop])
            print(f"  {name:<11} stops after epoch {stop:>2} of {len(accuracies)}: "
                  f"best so far {max(accuracies[:stop]):.3f}, {given_up:.3f} given up")
    return 0


if __name__ == "__main__":
    sys.exit(main())
