"""Running `eval`, `predict`, `export`, `train` and `merge` the way an attacked user would, in a
confined child (confined.py), and the small run folders they read.

`run_cli("eval", ...)` runs `python -m turbotrain ARGS` on the CPU under train_child's caps
(8 GiB of address space, 1.5 GiB peak RSS: torch loaded and a small model is ~0.8 GiB).
`make_run(folder, data, classes)` writes what a finished run leaves for those commands, without
training: a compact28 `best.safetensors` with its card and a `config.yaml` naming `data`.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from .confined import REPO, Ran, run_confined
from .train_child import ADDRESS_SPACE_LIMIT, PEAK_RSS_LIMIT


def child_env(**extra: str) -> dict:
    return {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra}


def run_cli(*args, cwd: Path, timeout: float = 90, env: dict | None = None,
            peak_rss: int = PEAK_RSS_LIMIT) -> Ran:
    """`turbotrain ARGS` (with the in-test pipelines registered for `train`) confined; its peak
    RSS asserted under peak_rss."""
    command = ([sys.executable, "-m", "tests.train.run_with_test_pipelines", *args[1:]]
               if args[0] == "train" else [sys.executable, "-m", "turbotrain", *args])
    ran = run_confined(command, address_space=ADDRESS_SPACE_LIMIT, timeout=timeout, cwd=cwd,
                       env=env or child_env())
    assert ran.peak_rss < peak_rss, f"the child peaked at {ran.peak_rss / 2**30:.2f} GiB"
    return ran


def make_run(run: Path, data, classes, *, image_size: int = 16) -> Path:
    """A run folder as train leaves it, as far as eval, predict and export read it."""
    import torch

    from turbotrain.train.models.models import build_model, get_model_spec
    from turbotrain.train.weights.weights import BEST_NAME, ModelCard, save_weights
    run.mkdir(parents=True)
    torch.manual_seed(0)
    card = ModelCard("compact28", tuple(classes), image_size, (70.0, 70.0, 70.0),
                     (60.0, 60.0, 60.0), info={"step": 1})
    model = build_model(get_model_spec("compact28"), len(classes), card.mean, card.std)
    save_weights(run / BEST_NAME, model, card)
    (run / "config.yaml").write_text(f"data: {data}\nbatch-size: 16\npipeline: pytorch\n"
                                     "device: cpu\nprecision: fp32\nchannels-last: false\n")
    return run
