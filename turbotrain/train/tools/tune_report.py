"""What `turbotrain tune` makes of its measurements: the rows, the recommended `train` command,
how it compares with what `train --pipeline auto` would pick, and the printed report."""
from __future__ import annotations

from dataclasses import dataclass

from .tune_levers import report_lines

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


def best_row(rows: list[Row], pick: str | None = None) -> Row | None:
    """The fastest with the model; rows within NOISE of it are ties, broken by train's own pick
    (`pick`, the pipeline `train --pipeline auto` takes: tune recommends it unless something
    else is measurably faster), then the lower data wait (more headroom when the model gets
    faster: bf16, compile), then fewer workers."""
    timed = [r for r in rows if r.train_images_per_second]
    if not timed:
        return None
    fastest = max(r.train_images_per_second for r in timed)
    ties = [r for r in timed if r.train_images_per_second >= (1 - NOISE) * fastest]
    return min(ties, key=lambda r: (r.pipeline != pick, r.data_wait_fraction or 0.0, r.workers))


def against_pick(best: Row | None, rows: list[Row], pick: str) -> str | None:
    """Why the recommendation is not train's own pick (None when it is)."""
    if best is None or best.pipeline == pick:
        return None  # nothing measured: the command is train's pick (format_report says so)
    picked = [r for r in rows if r.pipeline == pick]
    timed = [r for r in picked if r.train_images_per_second]
    if timed:
        ratio = best.train_images_per_second / max(r.train_images_per_second for r in timed)
        return (f"{best.pipeline} trained {ratio:.2f}x as many images/s as {pick} here "
                f"(more than the {NOISE:.0%} noise)")
    if not picked:
        return f"{pick} was not in --pipeline"
    notes = "; ".join(sorted({r.note for r in picked if r.note})) or "not measured"
    return f"{pick} was not measured with the model ({notes})"


def train_command(data, best: Row, batch: dict, *, device_type: str, asked: dict) -> str:
    """The `train` command for `best` with `batch` (tune's batch plan); `asked`: the flags tune
    was given that train must get too (model, image size, precision, order), None when auto."""
    parts = ["turbotrain train", f"--data {data}", f"--pipeline {best.pipeline}",
             f"--workers {best.workers}"]
    if device_type == "cpu":
        parts.append(f"--threads {best.threads}")
    parts += [f"--{flag} {value}" for flag, value in asked.items() if value is not None]
    parts.append(f"--batch-size {batch['batch_size']}")
    if batch["accum_steps"] > 1:
        parts.append(f"--accum-steps {batch['accum_steps']}")
    return " ".join(parts)


def format_report(result: dict) -> str:
    lines = [f"tune {result['data']}: {result['images']} images, {result['model']} at "
             f"{result['image_size']} px, {result['precision']}, {result['device']} "
             f"({result['cores']} cores), {result['seconds']:.0f} s of a "
             f"{result['budget_seconds']:.0f} s budget"
             + (f" (past it: {result['past_budget']})" if result["past_budget"] else ""),
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
    lines += report_lines(result)
    pick = result["train_pick"]
    verdict = (f"; tune differs: {result['differs']}" if result["differs"] else
               "; tune agrees" if result["best"] else "")
    lines.append(f"train --pipeline auto picks {pick['pipeline']} here ({pick['reason']})"
                 + verdict)
    if result["best"] is None:
        lines.append("nothing was measured with the model within the budget (raise "
                     "--budget-seconds); train's own pick, unmeasured:")
    shares = result.get("size_shares") or {}
    if len(shares) > 1:  # progressive resizing: the model rows stand for the whole run
        lines.append("train img/s is the run's under progressive resizing: timed at "
                     + ", ".join(f"{size} px ({share:.0%} of the epochs)"
                                 for size, share in shares.items()))
    if result.get("eager_note"):
        lines.append(f"note: {result['eager_note']}")
    lines.append(f"recommended: {result['command']}")
    return "\n".join(lines)
