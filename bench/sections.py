"""One renderer per benchmark of bench/registry.py: its JSON (bench/results/NAME.json) in,
its section's tables and words out (a `Body`), plus the goals it reports for the Goals table.
bench/report.py puts them together into BENCHMARKS.md.

A renderer is `@renders("NAME")`; NAME must be a benchmark of the registry, and every benchmark
has one (tests/bench). The goals come from the JSON: each script writes its own
(bench/common.py ratio_goal; gpu_check.py its "pipeline_goal"), so no threshold is copied here.
Plots (pipelines.png, time_to_accuracy.png) are drawn beside the JSON; a result recovered
without the points a plot needs lists the plot it kept (`"plots"`), which is linked as it is.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from registry import benchmark


@dataclass
class Goal:
    benchmark: str
    what: str
    goal: str
    measured: str
    met: bool | None  # None: nothing measured


@dataclass(frozen=True)
class Where:
    """Where the renderers put their plots and how the document links to them."""
    results: Path  # the JSON folder; plots are written beside it
    document: Path  # BENCHMARKS.md

    def plot(self, name: str) -> Path:
        return self.results / name

    def link(self, plot: Path) -> str:
        return os.path.relpath(plot, self.document.parent)

    def figure(self, draw: Callable[[dict, Path], Path | None], data: dict, name: str,
               alt: str) -> list[str]:
        """The document's lines for plot `name`: drawn from `data` by `draw`, else the one
        `data` says was kept beside it (a result recovered without the plot's points), when it
        is there; none when neither."""
        plot = draw(data, self.plot(name))
        if plot is None and name in data.get("plots", []) and self.plot(name).is_file():
            plot = self.plot(name)
        return [f"![{alt}]({self.link(plot)})\n"] if plot else []


@dataclass
class Body:
    lines: list[str] = field(default_factory=list)
    goals: list[Goal] = field(default_factory=list)

    @classmethod
    def table(cls, intro: str, headers: list[str], rows: list[list]) -> Body:
        """A section that is a paragraph saying what was measured, then its table."""
        return cls([intro, *md_table(headers, rows)])


# -- formatting -----------------------------------------------------------------------------------
def md_table(headers: list[str], rows: list[list]) -> list[str]:
    def cell(value) -> str:
        return "-" if value is None else str(value).replace("|", "\\|")
    lines = ["| " + " | ".join(headers) + " |",
             "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return lines + [""]


def rate(value) -> str | None:
    return None if value is None else f"{value:,.0f}"


def times(value) -> str | None:
    return None if value is None else f"{value:.2f}x"


def met_text(met: bool | None) -> str:
    return {True: "met", False: "**not met**", None: "not measured"}[met]


def recorded_goals(data: dict, benchmark: str) -> list[Goal]:
    """The goals a script wrote into its JSON (bench/common.py ratio_goal, or a time limit:
    "seconds" under "goal_seconds")."""
    goals = []
    for g in data.get("goals", []):
        if "goal_seconds" in g:
            goals.append(Goal(benchmark, g["what"], f"< {g['goal_seconds']:g} s",
                              f"{g['seconds']:.2f} s", g.get("met")))
        else:
            goals.append(Goal(benchmark, g["what"], f">= {g['goal']:g}x",
                              times(g.get("ratio")) or "-", g.get("met")))
    return goals


# -- one renderer per benchmark -------------------------------------------------------------------
Renderer = Callable[[dict, Where], Body]
RENDERERS: dict[str, Renderer] = {}  # benchmark name -> its renderer, in the registry's names


def renders(name: str) -> Callable[[Renderer], Renderer]:
    """Registers the decorated function as the renderer of benchmark `name`."""
    benchmark(name)  # an unknown name fails here, listing the registry's

    def register(function: Renderer) -> Renderer:
        RENDERERS[name] = function
        return function
    return register


@renders("prepare")
def render_prepare(data: dict, where: Where) -> Body:
    goals = recorded_goals(data, "prepare")
    body = Body(md_table(["images", "turbotrain prepare (images/s)",
                          "FFCV DatasetWriter (images/s)", "ratio", "goal"],
                         [[data.get("images"), rate(data.get("turbotrain_images_per_second")),
                           rate(data.get("plain_ffcv_images_per_second")),
                           times(data.get("speedup")), goals[0].goal if goals else None]]),
                goals)
    body.lines.insert(0, "Photo-like 500x375 q90 JPEGs to a .beton, 2 workers each, each a fresh "
                         "process (start-up counts), best of the repeats.\n")
    return body


@renders("sources")
def render_sources(data: dict, where: Where) -> Body:
    goals = recorded_goals(data, "sources")
    rates, ratios = data.get("images_per_second", {}), data.get("ratios", {})
    rows = [[kind, rate(rates.get(kind)), times(ratios.get(kind)) if kind in ratios else "1.00x"]
            for kind in ("imagefolder", "webdataset", "parquet")]
    body = Body(md_table(["source", "prepare-dataset (images/s)", "vs ImageFolder"], rows),
                goals)
    body.lines.insert(0, f"The same {data.get('images', '?')} photo-like 500x375 q90 JPEGs as an "
                         "ImageFolder, WebDataset .tar shards and Parquet (100-row groups), 2 "
                         "workers, each a fresh process, best of the repeats.\n")
    return body


@renders("prepare_ray")
def render_prepare_ray(data: dict, where: Where) -> Body:
    sizes = data.get("sizes", [])
    body = Body(md_table(["photos", "parts", "--engine local (images/s)",
                          "--engine ray (images/s)", "ratio", "Ray's overhead (s)",
                          "driver (parts/s)", "byte-identical"],
                         [[f"{size.get('images', 0):,}", size.get("parts"),
                           rate(size.get("local_images_per_second")),
                           rate(size.get("ray_images_per_second")), times(size.get("ratio")),
                           _seconds(size.get("overhead_seconds")),
                           size.get("driver_parts_per_second"), size.get("byte_identical")]
                          for size in sizes]),
                recorded_goals(data, "prepare_ray"))
    start = data.get("cluster_start_seconds")
    body.lines.insert(0, f"The same photo-like 500x375 q90 JPEGs, --shard-size "
                         f"{data.get('shard_size', '8MiB')}, on {data.get('cpus', 2)} cores: one "
                         "process with 2 workers, or the parts as Ray tasks of one CPU on a "
                         "running local cluster (each driver a fresh process: its start and "
                         "connection, the job's workers starting and the merge count"
                         + (f"; the cluster's own start, {start:.1f} s, does not" if start else "")
                         + "), best of the repeats. Ray's overhead (its seconds beyond local's) "
                         "is mostly fixed, so the goal is judged at the largest size.\n")
    return body


@renders("pipelines")
def render_pipelines(data: dict, where: Where) -> Body:
    rows = [[f"`{name}`", rate(r.get("images_per_second")), rate(r.get("images_per_cpu_second")),
             r.get("what") if r.get("images_per_second") else _run_error(r)]
            for name, r in data.get("results", {}).items()]
    body = Body()
    photos, cifar = data.get("photos", {}), data.get("cifar", {})
    body.lines.append(f"Photos: {photos.get('images')} JPEGs {photos.get('size')}, "
                      f"RandomResizedCrop {photos.get('image_size')} + flip, batch "
                      f"{photos.get('batch_size')}. CIFAR-sized: {cifar.get('images')} images "
                      f"{cifar.get('size')}, pad-crop + flip, batch {cifar.get('batch_size')}. "
                      f"{data.get('workers')} workers each; best of {data.get('rounds')} "
                      "interleaved rounds.\n")
    body.lines += md_table(["pipeline", "images/s", "images per CPU-second", "what"], rows)
    goal_rows = []
    for g in data.get("goals", []):
        metric = g.get("metric", "images_per_second")  # older results had no metric field
        per_cpu = metric == "images_per_cpu_second"
        pair = f"`{g['ours']}` / `{g['theirs']}`" + (" per CPU-second" if per_cpu else "")
        wanted = f">= {g['goal']}x" if g.get("goal") else "none (comparison)"
        goal_rows.append([pair, wanted, times(g.get("ratio_images_per_second")),
                          times(g.get("ratio_images_per_cpu_second")),
                          met_text(g.get("met")) if g.get("goal") else ""])
        if g.get("goal"):
            body.goals.append(Goal("pipelines", pair, wanted,
                                   times(g.get(f"ratio_{metric}")) or "-", g.get("met")))
    if goal_rows:
        body.lines += md_table(["ours / theirs", "goal", "ratio (images/s)",
                                "ratio (per CPU-second)", ""], goal_rows)
    body.lines += where.figure(plot_pipelines, data, "pipelines.png", "images/s per pipeline")
    return body


@renders("engines")
def render_engines(data: dict, where: Where) -> Body:
    entries = data.get("results", {})
    base = (entries.get("pytorch") or {}).get("images_per_second")
    rows = [[f"`{name}`", rate(r.get("images_per_second")),
             times(r["images_per_second"] / base) if r.get("images_per_second") and base else None,
             r.get("what") if r.get("images_per_second") else _run_error(r)]
            for name, r in entries.items()]
    photos = data.get("photos", {})
    return Body.table(f"Our pipelines through the registry, as the trainer builds them: "
                      f"{photos.get('images')} JPEGs {photos.get('size')}, RandomResizedCrop "
                      f"{photos.get('image_size')} + flip, batch {photos.get('batch_size')}, "
                      f"{data.get('workers')} threads, best of {data.get('rounds')} rounds. No "
                      "numeric goal: this is how the engines compare on a CPU.\n",
                      ["pipeline", "images/s", "vs pytorch", "what"], rows)


@renders("pillow")
def render_pillow(data: dict, where: Where) -> Body:
    if data.get("skipped"):
        return Body([f"Not measured: {data['skipped']}.\n"])
    rows = [[f"`{name}`", r.get("version"), rate(r.get("jpeg_images_per_second")),
             _ms(r.get("decode_ms")), _ms(r.get("resize_ms")),
             rate(r.get("png_prepare_images_per_second"))]
            for name, r in data.get("results", {}).items()]
    ratios = data.get("ratios", {})
    body = Body([f"{data.get('images')} photo-like JPEGs {data.get('size')}: Image.open + "
                 f"convert(\"RGB\"), then resize to {data.get('output')} (BILINEAR), one "
                 f"thread, best of {data.get('rounds')} interleaved rounds; plain pillow from a "
                 "`pip install --target` folder. PNG: prepare-dataset's one PIL path "
                 "(`encode_sample` on the same images as PNGs). No numeric goal: turbotrain's own "
                 "pipelines do not use PIL; this is what pillow-simd gives PIL-based loading.\n"])
    body.lines += md_table(["PIL", "PIL.__version__", "JPEG decode + resize /s", "decode ms",
                            "resize ms", "prepare PNG /s"], rows)
    body.lines.append(f"pillow-simd / pillow: decode + resize "
                      f"**{times(ratios.get('jpeg_decode_resize')) or 'n/a'}** (decode "
                      f"{times(ratios.get('decode')) or 'n/a'}, resize "
                      f"{times(ratios.get('resize')) or 'n/a'}); prepare-dataset on PNG sources "
                      f"{times(ratios.get('png_prepare')) or 'n/a'}.\n")
    return body


@renders("train_precision")
def render_train_precision(data: dict, where: Where) -> Body:
    rows = [[r["model"], r["image_size"], r["precision"],
             "channels_last" if r["channels_last"] else "contiguous",
             f"{r['images_per_second']:,.1f}", times(r.get("speedup_vs_fp32_contiguous"))]
            for r in data.get("results", [])]
    return Body.table(f"The trainer's step (uint8 stem, label-smoothed loss, Nesterov SGD) on "
                      f"data already in memory: {data.get('threads')} torch threads, batch "
                      f"{data.get('batch_size')}, {data.get('steps')} timed steps, best of "
                      f"{data.get('rounds')} rounds; CPU with native bf16: "
                      f"{data.get('cpu_native_bf16')}. No numeric goal: these numbers are why "
                      "`train` picks bf16 + channels_last on such CPUs.\n",
                      ["model", "px", "precision", "memory format", "images/s",
                       "vs fp32 contiguous"], rows)


@renders("time_to_accuracy")
def render_time_to_accuracy(data: dict, where: Where) -> Body:
    target = data.get("target", 0.9)
    ours, plain = data.get("turbotrain", {}), data.get("plain_pytorch", {})

    def row(name: str, r: dict) -> list:
        seconds = r.get("seconds_to_target")
        return [name, f"{seconds:.1f}" if seconds is not None else "not reached",
                r.get("epochs_to_target"), _percent(r.get("final_accuracy")),
                _seconds(r.get("seconds_per_epoch")), rate(r.get("images_per_second")),
                _seconds(r.get("process_seconds")), _seconds(r.get("prepare_seconds"))]
    epochs = data.get("epochs")
    body = Body([f"Fashion-MNIST ({data.get('train_images', 60000):,} train, "
                 f"{data.get('test_images', 10000):,} test images), {epochs} "
                 f"epoch{'' if epochs == 1 else 's'} each, compact28 on both sides; "
                 f"`turbotrain train` with its defaults ({_settings(ours)}) against a plain "
                 f"PyTorch script ({_settings(plain)}, per-sample torchvision transforms, "
                 "DataLoader workers). Seconds to target: "
                 "from the start of training, data loading and evaluation included, to the end "
                 "of the first evaluation at the target.\n"])
    if data.get("quick"):
        body.lines.insert(0, "**Smoke run (--quick) on a slice of the data: not a "
                             "measurement.**\n")
    user = data.get("plain_pytorch_user_recipe")
    runs = [row("turbotrain", ours), row("plain PyTorch", plain)]
    if user:
        runs.append(row("plain PyTorch, a user's recipe", user))
    body.lines += md_table(["run", f"seconds to {target:.0%}", "epochs", "final accuracy",
                            "s per epoch", "train images/s", "process s", "prepare s"], runs)
    speedup = data.get("speedup")
    body.goals = recorded_goals(data, "time_to_accuracy")
    wanted = f" (goal {body.goals[0].goal})" if body.goals else ""
    body.lines.append(f"Speedup: **{times(speedup) or 'n/a'}**{wanted}; counting the one-off "
                      f"prepare: {times(data.get('speedup_with_prepare')) or 'n/a'}; per epoch "
                      f"(after the first): {times(data.get('speedup_per_epoch')) or 'n/a'}. "
                      "The plain script runs the trainer's recipe, so that only the engineering "
                      "differs.\n")
    if user:
        bound = "at least " if data.get("speedup_vs_user_recipe_is_lower_bound") else ""
        body.lines.append(
            f"With a user's recipe instead ({user.get('settings', {}).get('recipe', 'Adam')}), "
            f"the same plain script {'reached' if user.get('seconds_to_target') is not None else 'did not reach'} "
            f"{target:.0%} in {epochs} epochs (final {_percent(user.get('final_accuracy'))}): "
            f"turbotrain is {bound}{times(data.get('speedup_vs_user_recipe')) or 'n/a'} faster "
            "to the target (no goal: this is what the recipe is worth on top).\n")
    body.lines += where.figure(plot_time_to_accuracy, data, "time_to_accuracy.png",
                               "val accuracy against wall time")
    return body


@renders("ddp")
def render_ddp(data: dict, where: Where) -> Body:
    rows = []
    for r in data.get("results", []):
        reduce = r.get("gradient_allreduce") or {}
        rows.append([r.get("model"), r.get("layout"), rate(r.get("images_per_second")),
                     times(r.get("speedup_vs_one_process")) or "-",
                     _percent(r.get("data_wait_fraction")),
                     f"{reduce['gradient_megabytes']:.1f} MB in {reduce['median_ms']:.2f} ms "
                     f"(median)" if reduce else "-"])
    return Body.table(f"`train` as one process vs two under `torchrun` (DDP over Gloo) on the "
                      f"same {data.get('cores')}-core CPU: global batch "
                      f"{data.get('global_batch')}, the trainer's own images/s, best of "
                      f"{data.get('rounds')} interleaved rounds. The all-reduce is timed alone, "
                      "between two processes. No numeric goal: on one CPU the processes share "
                      "the same cores, so this shows the cost of DDP's machinery rather than "
                      "scaling.\n",
                      ["model", "layout", "images/s", "vs one process", "data wait",
                       "gradient all-reduce"], rows)


@renders("loader")
def render_loader(data: dict, where: Where) -> Body:
    return _against_train(data, "loader", "`turbotrain.Loader` in a plain loop (forward, "
                          "cross-entropy, backward, SGD step)")


@renders("lightning")
def render_lightning(data: dict, where: Where) -> Body:
    body = _against_train(data, "lightning", "Lightning's `Trainer.fit` with "
                          "`TurbotrainDataModule` (no logger, progress bar or checkpoints)")
    profile = data.get("profile")
    if profile:
        body.lines.append(f"\nWhere the fit's {profile['fit_seconds']:.1f} s went (Lightning's "
                          "SimpleProfiler, one more run; nested actions include their "
                          "children):\n")
        body.lines += md_table(["action", "seconds"], [[f"`{action}`", f"{seconds:.3f}"]
                                                       for action, seconds in
                                                       profile["actions"].items()])
    elif data.get("profile_error"):
        body.lines.append(f"\nThe profiled run failed: {data['profile_error']}\n")
    return body


def _against_train(data: dict, ours: str, what: str) -> Body:
    """bench_loader.py / bench_lightning.py: `ours` against `train`, same settings."""
    results = data.get("results", {})
    rows = []
    for name, label in ((ours, what), ("train", "the `train` command (its summary.json)")):
        result = results.get(name, {})
        rows.append([f"`{name}`", rate(result.get("images_per_second")) or _run_error(result),
                     label])
    body = Body([f"{data.get('model')} at {data.get('image_size')} px, batch "
                 f"{data.get('batch_size')}, {data.get('precision')}, the "
                 f"`{data.get('pipeline')}` pipeline on {data.get('images')} photos: "
                 f"{data.get('steps')} steps of which {data.get('warmup_steps')} warm-up, "
                 f"{data.get('rounds')} interleaved rounds (the order swapped every round), "
                 f"each run in a fresh process; images/s: the best run. {ours} / train, the "
                 f"median of the rounds' ratios: **{times(data.get('ratio')) or 'n/a'}**.\n"])
    body.lines += md_table(["contender", "images/s", "what"], rows)
    body.goals = recorded_goals(data, ours)
    return body


@renders("predict")
def render_predict(data: dict, where: Where) -> Body:
    results = data.get("results", {})
    body = Body([f"`turbotrain predict` on a folder of {data.get('images')} JPEGs "
                 f"{data.get('size')} against the eval pipeline (`pytorch`, train=False) on "
                 f"the dataset `prepare-dataset` made of the same files: batch "
                 f"{data.get('batch_size')}, {data.get('workers')} input threads, best of "
                 f"{data.get('rounds')} interleaved rounds. *Input*: predict's batch source "
                 "(read, store as prepare would, decode and crop with the pipeline's decoder) "
                 "against the pipeline alone; *command*: the whole `predict` and `eval` "
                 "commands with the same model (airbench, random weights), each one's own "
                 "images/s.\n"])
    rows = [[f"input, {size} px", rate(r.get("predict")), rate(r.get("eval_pipeline")),
             times(r.get("ratio"))] for size, r in results.get("input", {}).items()]
    command = results.get("command") or {}
    if command:
        rows.append(["command, 64 px", rate(command.get("predict")), rate(command.get("eval")),
                     times(command.get("ratio"))])
    body.lines += md_table(["what", "predict (images/s)", "eval (images/s)", "ratio"], rows)
    loads = [[f"`{model}`", f"{r['load_seconds']:.2f}", f"{r['bytes'] / 1e6:.0f} MB",
              f"{r['process_seconds']:.1f}"] for model, r in data.get("load", {}).items()]
    if loads:
        body.lines += md_table(["weights", "load (s)", "file", "whole predict of one image (s)"],
                               loads)
    body.goals += recorded_goals(data, "predict")
    return body


@renders("order")
def render_order(data: dict, where: Where) -> Body:
    best = data.get("best") or {}
    rows = [[f"`{name}`", rate((best.get(name) or {}).get("images_per_second")),
             rate((best.get(name) or {}).get("stored_mib_per_second")),
             (best.get(name) or {}).get("cache_drops"),
             what if (best.get(name) or {}).get("images_per_second") else
             _run_error({"runs": (data.get("runs") or {}).get(name, [])})]
            for name, what in (data.get("contenders") or {}).items()]
    body = Body([f"A split of {data.get('split_mib')} MiB of raw images "
                 f"({rate(data.get('sample_bytes'))} bytes each) read with a page-cache limit of "
                 f"{data.get('limit_mib')} MiB (the loader drops the file from the cache past "
                 f"it; read_ahead_kb {data.get('read_ahead_kb')}), each contender in a fresh "
                 f"process, best of the interleaved rounds. The absolute numbers are this "
                 "machine's virtual disk; the ratio is the point.\n"])
    body.lines += md_table(["contender", "images/s", "MiB/s stored", "cache drops", "what"], rows)
    body.lines.append("Quasi-random / random: " + "; ".join(
        f"{r['what']} **{times(r.get('ratio')) or 'n/a'}**" for r in data.get("ratios", []))
        + ".\n")
    body.goals += recorded_goals(data, "order")
    return body


@renders("remote")
def render_remote(data: dict, where: Where) -> Body:
    split, read = data.get("split") or {}, data.get("read") or {}
    ratios = data.get("ratios") or {}
    body = Body([f"Through `open_dataset`, against a local S3-compatible server (moto's, in "
                 f"the benchmark's process): every sample of a {split.get('shards')}-shard "
                 f"split of {rate(split.get('samples'))} raw {split.get('side')} px images, read "
                 "shard after shard (shuffled within each, no decode), each read in a fresh "
                 f"process, best of {data.get('rounds')} interleaved rounds.\n"])
    body.lines += md_table(
        ["read from", "samples/s", "MB/s of shards", "vs local"],
        [["local folder", rate(read.get("local_images_per_second")), None, None],
         ["s3://, warm cache", rate(read.get("warm_images_per_second")), None,
          times(ratios.get("warm_vs_local"))],
         ["s3://, empty cache (downloads included)", rate(read.get("cold_images_per_second")),
          rate(read.get("cold_mb_per_second")), None],
         ["the store alone (obstore downloads)", None, rate(read.get("store_mb_per_second")),
          None]])
    body.lines.append(f"Empty cache / the store's own bandwidth: "
                      f"**{times(ratios.get('cold_vs_store')) or 'n/a'}** of its MB/s (no goal: "
                      "what a first epoch from object storage costs here).\n")
    clients = data.get("results") or {}
    body.lines.append(f"Object-store clients, each in a fresh process: {data.get('shards')} "
                      f"whole shards of {data.get('shard_mib')} MiB, and a shard's metadata "
                      "(two range reads: header + field descriptors, then a 10,000-row table), "
                      f"best of {data.get('rounds')} rounds.\n")
    body.lines += md_table(["client", "version", "whole shards (MB/s)", "metadata (ms)"],
                           [[f"`{name}`", r.get("version"), rate(r.get("whole_mb_per_second")),
                             _ms(r.get("metadata_ms"))] for name, r in clients.items()])
    body.lines.append(f"obstore / s3fs: whole shards {times(ratios.get('whole')) or 'n/a'}, "
                      f"metadata {times(ratios.get('metadata')) or 'n/a'} faster (no goal: why "
                      "turbotrain reads through obstore).\n")
    body.goals += recorded_goals(data, "remote")
    return body


@renders("doctor")
def render_doctor(data: dict, where: Where) -> Body:
    cases = data.get("cases", [])
    rows = []
    for c in cases:
        found = c.get("top") or c.get("skipped") or c.get("error")
        error = c.get("error_pct")
        rows.append([c["case"], f"`{c.get('expected')}`", found, times(c.get("predicted")),
                     times(c.get("measured")), None if error is None else f"{error:+.0f}%"])
    body = Body([f"`turbotrain doctor` on bench/doctor_script.py with one planted mistake each "
                 f"({data.get('cores')} cores, native bf16: {data.get('cpu_native_bf16')}); the "
                 f"top finding's change applied; speedup of the script's own images/s, best of "
                 f"{data.get('rounds')} runs before and after, {data.get('steps')} timed "
                 "steps.\n"])
    body.lines += md_table(["planted mistake", "expected finding", "top finding",
                            "predicted", "measured", "predicted vs measured"], rows)
    hook = data.get("overhead", [])
    body.lines += md_table(["hook overhead on", "images/s without", "with the hook",
                            "overhead"],
                           [[h.get("case"), rate(max(filter(None, h.get("without", [])),
                                                     default=None)),
                             rate(max(filter(None, h.get("with_hook", [])), default=None)),
                             None if h.get("overhead_pct") is None
                             else f"{h['overhead_pct']:.1f}%"] for h in hook])
    done = [c for c in cases if "skipped" not in c]
    errors = [abs(c["error_pct"]) for c in done if c.get("error_pct") is not None]
    overheads = [h["overhead_pct"] for h in hook if h.get("overhead_pct") is not None]
    body.goals += [
        Goal("doctor", "the top finding is the planted mistake, every case", "all",
             f"{sum(bool(c.get('right')) for c in done)}/{len(done)}",
             all(c.get("right") for c in done) if done else None),
        Goal("doctor", "predicted speedup vs measured, the worst case", "within 30 %",
             f"{max(errors):.0f}%" if errors else "-",
             (len(errors) == len(done) and max(errors) <= 30) if errors else None),
        Goal("doctor", "the hook's overhead on a step", "<= 2 %",
             f"{max(overheads):.1f}%" if overheads else "-",
             max(overheads) <= 2 if overheads else None)]
    return body


@renders("demo")
def render_demo(data: dict, where: Where) -> Body:
    demo, budgets = data.get("demo") or {}, data.get("budgets") or []
    body = Body([])
    if demo:
        body.lines.append(f"`turbotrain demo`, end to end in a fresh process: training "
                          f"**{demo.get('train_seconds')} s** ({demo.get('model')} at "
                          f"{demo.get('image_size')} px, {demo.get('precision')}, "
                          f"{demo.get('epochs')} epochs), val accuracy "
                          f"**{_percent(demo.get('val_accuracy'))}**, "
                          f"{demo.get('total_seconds')} s in all with writing and preparing "
                          f"the images{_demo_end(demo)}.\n")
    body.lines.append("`train --time-budget B` on the demo's prepared dataset "
                      f"({' '.join((budgets[0].get('flags') or []) if budgets else [])}), "
                      "each in a fresh process:\n")
    body.lines += md_table(["budget", "training time", "used", "epochs", "val accuracy"],
                           [[f"{b['budget_seconds']:g} s", f"{b['train_seconds']} s",
                             _percent(b.get("used_fraction")), b.get("epochs"),
                             _percent(b.get("val_accuracy"))] for b in budgets])
    body.goals += recorded_goals(data, "demo")
    return body


def _demo_end(demo: dict) -> str:
    """How the demo's training ended: at its --target-accuracy, or at its --time-budget."""
    if demo.get("outcome") == "target_accuracy":
        return (f"; it stopped at epoch {demo.get('target_reached_epoch')}, the first to reach "
                f"its {_percent(demo.get('target_accuracy'))} target (time budget "
                f"{demo.get('time_budget_seconds'):g} s)")
    budget = demo.get("time_budget_seconds")
    return f"; it ran to its {budget:g} s time budget" if budget else ""


def _ms(value) -> str | None:
    return None if value is None else f"{value:.2f}"


def _percent(value) -> str | None:
    return None if value is None else f"{value:.2%}"


def _seconds(value) -> str | None:
    return None if value is None else f"{value:.1f}"


def _settings(result: dict) -> str:
    s = result.get("settings") or {}
    parts = [s.get("precision"), "channels_last" if s.get("channels_last") else "contiguous",
             f"{s.get('pipeline')} pipeline" if s.get("pipeline") else None,
             f"batch {s.get('batch_size')}" if s.get("batch_size") else None,
             f"{s.get('torch_threads')} torch threads" if s.get("torch_threads") else None]
    return ", ".join(p for p in parts if p) or "settings not recorded"


def _run_error(result: dict) -> str:
    errors = [r.get("error") for r in result.get("runs", []) if r.get("error")]
    return f"failed: {errors[-1]}" if errors else "no result"


# -- plots (matplotlib Agg: no display) -----------------------------------------------------------
def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_pipelines(data: dict, path: Path) -> Path | None:
    """Bars of images/s: photo pipelines (with bare decode as a line: the ceiling a decode-bound
    pipeline cannot pass) and, on their own axis, the 100x faster CIFAR-sized ones."""
    results = {n: r["images_per_second"] for n, r in data.get("results", {}).items()
               if r.get("images_per_second")}
    if not results:
        return None
    bare = results.pop("bare_decode", None)
    photos = {n: v for n, v in results.items() if not n.endswith("_cifar")}
    cifar = {n: v for n, v in results.items() if n.endswith("_cifar")}
    plt = _pyplot()
    panels = [(p, t) for p, t in ((photos, "photos: 224 px from ~500x375 JPEGs"),
                                  (cifar, "CIFAR-sized: 32 px raw")) if p]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.2), squeeze=False,
                             constrained_layout=True)
    for ax, (values, title) in zip(axes[0], panels):
        names = list(values)
        colours = ["C0" if n.startswith(("pytorch", "resident")) else "C7" for n in names]
        bars = ax.bar(names, [values[n] for n in names], color=colours)
        ax.bar_label(bars, labels=[f"{values[n]:,.0f}" for n in names], fontsize=8)
        if bare and values is photos:
            ax.axhline(bare, color="C3", ls="--", lw=1.2, label=f"bare decode {bare:,.0f}/s")
            ax.legend(loc="upper right", fontsize=8)
        ax.set(title=title, ylabel="images/s")
        ax.tick_params(axis="x", rotation=30, labelsize=8)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("Input pipelines (blue: turbotrain, grey: others)", fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_time_to_accuracy(data: dict, path: Path) -> Path | None:
    sides = [(key, name, (data.get(key) or {}).get("curve") or []) for key, name in
             (("turbotrain", "turbotrain (defaults)"), ("plain_pytorch", "plain PyTorch"),
              ("plain_pytorch_user_recipe", "plain PyTorch, a user's recipe (Adam)"))]
    if not any(points for _, _, points in sides):
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2), constrained_layout=True)
    target = data.get("target", 0.9)
    for colour, (key, name, points) in zip(("C0", "C1", "C2"), sides):
        if not points:
            continue
        ax.plot([p[0] for p in points], [p[1] for p in points], "o-", color=colour, label=name)
        reached = data[key].get("seconds_to_target")
        if reached is not None:
            ax.axvline(reached, color=colour, ls=":", lw=1)
            ax.annotate(f"{reached:.0f} s", (reached, target), textcoords="offset points",
                        xytext=(4, -12), color=colour, fontsize=8)
    ax.axhline(target, color="C3", ls="--", lw=1, label=f"target {target:.0%}")
    ax.set(xlabel="wall seconds since training started", ylabel="val accuracy",
           title="Fashion-MNIST: val accuracy after each epoch")
    ax.set_xlim(left=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="best")  # where it hides the fewest points
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path

@renders("kernel")
def render_kernel(data: dict, where: Where) -> Body:
    busy, modes, stages = data.get("busy", {}), data.get("modes", {}), data.get("stages", {})
    body = Body([f"The compiled decode kernel. {data.get('images')} photo-like JPEGs "
                 f"{data.get('size')}, RandomResizedCrop {data.get('image_size')} + flip, batch "
                 f"{data.get('batch_size')}, every measurement a fresh process. *Beside a "
                 "Python-busy thread*: a second thread of the same process runs a pure-Python "
                 "counting loop (what a host-bound training loop's main thread is) while the "
                 "loader is consumed; alone and busy run back to back in the same process, "
                 "the order swapped each round, and *kept* is the median of the rounds' "
                 "busy / alone. `pytorch_python` is the same pipeline on the Python decode path "
                 "(TURBOTRAIN_NATIVE=0, the code before the kernel); `native_calls` is a Python "
                 "thread pool making one native call per batch (the mechanism not chosen).\n"])

    def kept_rows(results: dict) -> list[list]:
        return [[f"`{name}`", rate(r.get("alone")), rate(r.get("busy")),
                 f"{r['kept']:.0%}" if "kept" in r else f"failed: {r.get('error')}"]
                for name, r in results.items()]
    headers = ["loader", "alone (images/s)", "beside a busy thread", "kept"]
    body.lines += ["One decode thread:\n"] + md_table(headers, kept_rows(busy))
    if modes:
        body.lines += ["Two decode threads (the plan's worker_mode rule):\n"]
        body.lines += md_table(headers, kept_rows(modes))
    if stages:
        rows = []
        for label, what in (("region", "region decode (the pipelines')"),
                            ("full", "full decode, then crop")):
            r = stages.get(label) or {}
            per_image = r.get("python_per_batch_us", 0) / (data.get("batch_size") or 1)
            rows.append([what, f"{per_image:.1f}", _us(r.get("decode_us")),
                         _us(r.get("resize_us"))])
        body.lines += ["Where one sample's time goes, one thread (µs per image; *Python* is "
                       "the per-batch table building divided by the batch):\n"]
        body.lines += md_table(["kernel", "Python", "decode", "resize + flip"], rows)
        body.lines.append(f"The Python decode path: {_us(stages.get('python_path_us'))} µs "
                          "per image, everything included.\n")
    feed = data.get("feed") or {}
    if "before_us" in feed:
        body.lines.append(f"DALI's feed (graph_inputs' payloads and header checks): "
                          f"{feed['before_us']:.1f} µs per image as a per-sample Python loop, "
                          f"{feed['after_us']:.1f} µs vectorised with one native header "
                          "check per batch.\n")
    use = data.get("use") or {}
    if use:
        rows = [[path, rate((use.get(key) or {}).get("predict_images_per_second")),
                 f"{(use.get(key) or {}).get('resident_load_s', float('nan')):.2f} s"]
                for key, path in (("python", "Python decode path (before)"),
                                  ("native", "native kernel"))]
        body.lines += md_table(["", "predict input (images/s)", "resident load (s)"], rows)
    body.goals += recorded_goals(data, "kernel")
    return body


def _us(value) -> str | None:
    return None if value is None else f"{value:,.0f}"


@renders("gpu_check")
def render_gpu(data: dict, where: Where) -> Body:
    """The GPU section from gpu_check.json; plain words when it holds only the CPU smoke run."""
    goal = data.get("pipeline_goal")  # gpu_check.py's GOAL

    def gpu_goal(worst: tuple[float, str] | None) -> Goal:
        return Goal("gpu_check", "every pipeline / synthetic-data bound",
                    f">= {goal:.0%}" if goal else "-",
                    f"{worst[0]:.1%} (worst: {worst[1]})" if worst else "-",
                    None if worst is None or goal is None else worst[0] >= goal)
    if (data.get("settings") or {}).get("device") != "cuda":
        return Body(["**No GPU table was measured** (gpu_check.json holds only the CPU smoke "
                     "run).\n"], [gpu_goal(None)])
    rows, shares = [], []
    for r in data.get("rows", []):
        if r.get("error"):
            rows.append([r["pipeline"], None, None, None, f"failed: {r['error']}"])
            continue
        share = r.get("of_bound")
        if share is not None and not r["pipeline"].startswith("synthetic"):
            shares.append((share, r["pipeline"]))
        rows.append([r["pipeline"], rate(r.get("alone")), rate(r.get("train")),
                     _percent(share),
                     "" if share is None or goal is None or share >= goal else f"< {goal:.0%}"])
    body = Body()
    settings = data.get("settings") or {}
    body.lines.append(f"{data.get('device')}, torch {data.get('torch')}: {settings.get('model')} "
                      f"training at {settings.get('image_size')} px, batch "
                      f"{settings.get('batch_size')} (bf16, channels_last, torch.compile) fed by "
                      "each pipeline, against the same step on a synthetic batch already on the "
                      "GPU.\n")
    body.lines += md_table(["pipeline", "loader alone (images/s)", "training (images/s)",
                            "of synthetic bound", ""], rows)
    checks = [[c["check"], "ok" if c["ok"] else "**FAILED**", c["detail"]]
              for c in data.get("checks", [])]
    if checks:
        body.lines += md_table(["check", "result", "detail"], checks)
    goals = [[g["goal"], g["measured"], g["verdict"]] for g in data.get("goals", [])]
    if goals:  # gpu_check.py --all
        body.lines += md_table(["goal (gpu_check.py --all)", "measured", "verdict"], goals)
    body.lines += [f"- {note}" for note in data.get("notes", [])] + [""]
    body.goals.append(gpu_goal(min(shares) if shares else None))
    return body
