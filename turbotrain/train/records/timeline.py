"""RUNDIR/timeline.png: per-step data wait vs compute, stacked, over the whole run.

A stall (the loader refilling at an epoch start, a slow disk, a checkpoint's page-cache
eviction) shows up as a red spike above the blue compute band. Epoch starts are dotted lines,
the step a resumed run continued from a dashed one. Evaluations run between steps, so they
have no width on the step axis: each is a mark at the step it followed, labelled with its
seconds, and the legend gives their total (the run's wall time is steps + evaluations + the
rest).

Memory stays bounded on long runs: at most MAX_POINTS buckets are kept; when full, neighbours
merge (each bucket then averages twice as many steps), so a 1 M-step run costs the same few
hundred KB as a 4 k-step one. The buckets are saved in each checkpoint under "timeline"
(`state_dict`, ~130 KB when full), so a resumed run appends to them and its picture covers the
whole run; a checkpoint from before that holds none, and the picture then starts at the resume.
"""
from __future__ import annotations

from array import array
from pathlib import Path

from .profiling import StepTime
from .report import save_figure

TIMELINE_NAME = "timeline.png"
MAX_POINTS = 4096  # buckets kept; ~2x a figure's pixel width, so merging is never visible
EVAL_LABELS = 12  # evaluations labelled with their seconds; past this the labels overlap


class StepTimeline:
    def __init__(self, max_points: int = MAX_POINTS):
        self.max_points = max(2, max_points)
        self.per_bucket = 1  # steps merged into one bucket
        self.first_step = array("q")  # step number of each bucket's first step
        self.data_wait = array("d")  # seconds summed over the bucket's steps
        self.compute = array("d")
        self.counts = array("q")
        self.epoch_starts: list[int] = []  # step numbers
        self.resumes: list[int] = []  # the first step of each resumed process
        # [step, px] where the training size changed (progressive resizing), the first included
        self.sizes: list[list[int]] = []
        self.profiled: tuple[int, int] | None = None  # (first, last) profiled step
        self.stopped: tuple[int, str] | None = None  # (step, why): --target-accuracy, --time-budget
        self.evals: list[list[float]] = []  # [step, seconds] of each evaluation, after the step

    def __len__(self) -> int:
        return len(self.counts)

    def add(self, steps: list[StepTime]) -> None:
        for s in steps:
            if self._last_full() and len(self.counts) >= self.max_points:
                self._halve()
            if self._last_full():
                self.first_step.append(s.step)
                self.data_wait.append(0.0)
                self.compute.append(0.0)
                self.counts.append(0)
            self.data_wait[-1] += s.data_wait
            self.compute[-1] += s.compute
            self.counts[-1] += 1

    def _last_full(self) -> bool:
        return not self.counts or self.counts[-1] >= self.per_bucket

    def _halve(self) -> None:
        """Merges buckets pairwise: half the points, twice the steps per bucket."""
        self.per_bucket *= 2
        columns = (self.first_step, self.data_wait, self.compute, self.counts)
        merged = [array(c.typecode) for c in columns]
        for i in range(0, len(self.counts), 2):
            j = min(i + 1, len(self.counts) - 1)
            merged[0].append(self.first_step[i])
            for k in (1, 2, 3):
                merged[k].append(columns[k][i] + (columns[k][j] if j != i else 0))
        self.first_step, self.data_wait, self.compute, self.counts = merged

    def mark_epoch(self, step: int) -> None:
        if not self.epoch_starts or self.epoch_starts[-1] != step:
            self.epoch_starts.append(step)

    def mark_resume(self, step: int) -> None:
        self.resumes.append(step)

    def mark_eval(self, step: int, seconds: float) -> None:
        """An evaluation of `seconds` ran after optimizer step `step`."""
        self.evals.append([int(step), float(seconds)])

    def mark_size(self, step: int, size: int) -> None:
        """The batches are `size` px from `step` on (marked only where the size changes)."""
        if not self.sizes or self.sizes[-1][1] != size:
            self.sizes.append([int(step), int(size)])

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict:
        """Plain lists and numbers: what torch.load(weights_only=True) reads back."""
        return {"per_bucket": self.per_bucket, "first_step": list(self.first_step),
                "data_wait": list(self.data_wait), "compute": list(self.compute),
                "counts": list(self.counts), "epoch_starts": list(self.epoch_starts),
                "resumes": list(self.resumes), "sizes": [list(s) for s in self.sizes],
                "evals": [list(e) for e in self.evals],
                "profiled": list(self.profiled) if self.profiled is not None else None}

    def load_state_dict(self, saved: dict) -> None:
        """From `state_dict()`'s output, each value checked (TypeError/ValueError otherwise:
        the caller reports a damaged checkpoint). Capped at MAX_POINTS, as `add` keeps it."""
        per_bucket = saved["per_bucket"]
        columns = [saved[name] for name in ("first_step", "data_wait", "compute", "counts")]
        marks = [saved["epoch_starts"], saved["resumes"]]
        profiled = saved["profiled"]
        if type(per_bucket) is not int or per_bucket < 1:
            raise ValueError(f"timeline per_bucket is {per_bucket!r:.60}")
        if not all(isinstance(c, list) for c in columns + marks) or \
                len({len(c) for c in columns}) != 1 or len(columns[0]) > self.max_points:
            raise ValueError("timeline columns are not lists of one length up to "
                             f"{self.max_points}")
        if profiled is not None and not (isinstance(profiled, list) and len(profiled) == 2):
            raise ValueError(f"timeline profiled is {profiled!r:.60}")
        typecodes = ("q", "d", "d", "q")
        loaded = [array(code, values) for code, values in zip(typecodes, columns)]  # TypeError
        if any(n < 1 for n in loaded[3]) or not all(t >= 0 for t in loaded[1] + loaded[2]):
            raise ValueError("timeline holds negative times or empty buckets")
        self.per_bucket = per_bucket
        self.first_step, self.data_wait, self.compute, self.counts = loaded
        self.epoch_starts, self.resumes = (list(array("q", m)) for m in marks)
        sizes = saved.get("sizes", [])  # absent from checkpoints before progressive resizing
        if not (isinstance(sizes, list) and all(isinstance(s, list) and len(s) == 2
                                                for s in sizes)):
            raise ValueError(f"timeline sizes are {sizes!r:.60}")
        self.sizes = [list(array("q", s)) for s in sizes]
        evals = saved.get("evals", [])  # absent from checkpoints before evaluations were drawn
        if not (isinstance(evals, list) and all(
                isinstance(e, list) and len(e) == 2 and type(e[0]) is int
                and type(e[1]) in (int, float) and e[1] >= 0 for e in evals)):
            raise ValueError(f"timeline evals are {evals!r:.60}")
        self.evals = [[e[0], float(e[1])] for e in evals]
        self.profiled = tuple(array("q", profiled)) if profiled is not None else None

    # ------------------------------------------------------------------ the picture

    def plot(self, path: str | Path, title: str = "") -> Path | None:
        """Writes the picture; None when no timed step was recorded."""
        if not self.counts:
            return None
        import matplotlib
        matplotlib.use("Agg")  # no display needed; safe in CI and under torchrun
        import matplotlib.pyplot as plt

        # Mean milliseconds per step in each bucket, drawn as steps (one flat segment a bucket).
        x = list(self.first_step)
        wait = [1000 * w / n for w, n in zip(self.data_wait, self.counts)]
        compute = [1000 * c / n for c, n in zip(self.compute, self.counts)]
        total = [w + c for w, c in zip(wait, compute)]
        x.append(x[-1] + self.counts[-1])
        wait.append(wait[-1])
        total.append(total[-1])
        fig, ax = plt.subplots(figsize=(11, 4), constrained_layout=True)
        ax.fill_between(x, 0, wait, step="post", color="C3", alpha=0.85,
                        label="waiting for data")
        ax.fill_between(x, wait, total, step="post", color="C0", alpha=0.7,
                        label="forward + backward + step")
        for i, step in enumerate(self.epoch_starts):
            ax.axvline(step, color="0.4", ls=":", lw=1, label="epoch start" if i == 0 else None)
        for i, step in enumerate(self.resumes):
            ax.axvline(step, color="C4", ls="--", lw=1.5,
                       label="resumed (--resume)" if i == 0 else None)
        if len(self.sizes) > 1:  # progressive resizing: each size from where it starts
            for step, size in self.sizes:
                ax.axvline(step, color="C2", ls="-.", lw=1)
                ax.annotate(f"{size} px", (step, 1), xycoords=("data", "axes fraction"),
                            xytext=(3, -12), textcoords="offset points", color="C2")
        self._draw_evals(ax)
        if self.profiled is not None:
            ax.axvspan(self.profiled[0], self.profiled[1] + 1, color="C2", alpha=0.15,
                       label="profiled (--profile)")
        if self.stopped is not None:
            ax.axvline(self.stopped[0], color="C1", lw=2,
                       label=f"stopped: {self.stopped[1].replace('_', ' ')}")
        steps_note = f", {self.per_bucket} steps per point" if self.per_bucket > 1 else ""
        ax.set(xlabel="optimizer step", ylabel="ms per step",
               title=(title + steps_note) if title else steps_note.lstrip(", "))
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=4, frameon=False)
        return save_figure(fig, path)

    def _draw_evals(self, ax) -> None:
        """Each evaluation as a mark at the top of the plot at its step, with its seconds
        (the first few; more would overlap), and their total in the legend."""
        if not self.evals:
            return
        steps = [step for step, _ in self.evals]
        total = sum(seconds for _, seconds in self.evals)
        ax.plot(steps, [1.0] * len(steps), "v", color="C5", ms=7, clip_on=False,
                transform=ax.get_xaxis_transform(),
                label=f"evaluation ({len(steps)}, {total:.3g} s in all, not in the steps)")
        if len(steps) <= EVAL_LABELS:
            for step, seconds in self.evals:
                ax.annotate(f"{seconds:.2g} s", (step, 1), xycoords=("data", "axes fraction"),
                            xytext=(-6, -22), textcoords="offset points", color="C5",
                            fontsize=8)
