"""scripts/import_graph.py: on a toy package it finds a planted import cycle and an import that
goes back up the layers; on turbotrain, no module-level import goes back up the layer order
(cli > train's folders > pipeline > datasets' folders > files) and none closes a cycle."""
from __future__ import annotations

import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("child_processes")  # not in make test-fast

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "import_graph.py"

TOY = {
    "__init__.py": "",
    "cli.py": "from .train import run\n",
    "train/__init__.py": "",
    "train/run.py": ("from toy.pipeline import load\n\n\n"
                     "def go():\n    from . import helper\n    return helper\n"),
    "train/helper.py": ("import os\n\n\n"
                        "def f():\n    import json\n    from .run import go\n"
                        "    return go, json, os\n\n\n"
                        "def g():\n    # lazy: a reason\n    from . import run\n"
                        "    from .run import go  # (the run of imports shares it)\n"
                        "    return run, go\n"),
    "pipeline/__init__.py": "",
    "pipeline/load.py": "from ..datasets import read\n",
    "datasets/__init__.py": "",
    # Planted: datasets importing pipeline goes back up, and closes a module-level cycle.
    "datasets/read.py": ("from typing import TYPE_CHECKING\n"
                         "from toy.pipeline import load\n"
                         "if TYPE_CHECKING:\n    from toy.cli import run  # never runs: no edge\n"),
}


def graph(*args) -> dict:
    done = subprocess.run([sys.executable, str(SCRIPT), *map(str, args), "--json"],
                          capture_output=True, text=True, check=True, timeout=120)
    return json.loads(done.stdout)


def test_finds_a_planted_cycle_and_a_back_up_import(tmp_path):
    for name, text in TOY.items():
        (tmp_path / "toy" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "toy" / name).write_text(text)
    r = graph("--root", tmp_path / "toy", "--layers", "toy.cli > toy.train > toy.pipeline > "
              "toy.datasets > toy")
    assert r["back_up_imports"]["module"] == ["toy.datasets.read:2 -> toy.pipeline.load"]
    assert r["back_up_imports"]["function"] == []
    assert [c["modules"] for c in r["cycles_module_level"]["components"]] == [
        ["toy.datasets.read", "toy.pipeline.load"]]
    assert sorted(c["modules"] for c in r["cycles_with_function_level"]["components"]) == [
        ["toy.datasets.read", "toy.pipeline.load"], ["toy.train.helper", "toy.train.run"]]
    # cli -> train.run -> (pipeline.load <-> datasets.read: one step)
    assert r["import_levels"] == 3
    assert r["longest_chain"][0] == "toy.cli"
    assert r["function_level_imports"] == {
        "ours": 4, "all": 5, "unexplained": ["toy.train.helper:6", "toy.train.run:5"]}
    assert r["folders"]["toy/train"]["modules"] == 3
    assert r["longest_functions"][0]["function"].startswith("toy.train.helper:")


def test_turbotrain_imports_go_down_only():
    r = graph()
    assert r["back_up_imports"]["module"] == []
    assert r["cycles_module_level"]["components"] == []


def test_every_function_level_import_of_ours_says_why():
    """Issue 25: an import of our modules inside a function stays only to keep start-up fast or
    an optional part optional, and its `# lazy:` comment says which."""
    assert graph()["function_level_imports"]["unexplained"] == []


def test_datasets_folders_are_layered():
    """Issue 33: datasets/ split by concern, its folders ordered prepare > sources > remote >
    beton > errors with turbotrain.files below them; none of their imports goes back up, not
    even inside a function (open_dataset's lazy URL import goes down, into remote/), and no
    folder holds more than 12 modules."""
    layers = [group.strip() for group in runpy.run_path(str(SCRIPT))["DEFAULT_LAYERS"].split(">")]
    below = layers[layers.index("turbotrain.datasets"):]
    assert below == ["turbotrain.datasets", "turbotrain.datasets.prepare",
                     "turbotrain.datasets.sources", "turbotrain.datasets.remote",
                     "turbotrain.datasets.beton", "turbotrain.datasets.errors",
                     "turbotrain.files", "turbotrain"]
    r = graph()
    ours = ("turbotrain.datasets", "turbotrain.files")
    assert [i for kind in ("module", "function") for i in r["back_up_imports"][kind]
            if i.startswith(ours)] == []
    assert not [c for c in r["cycles_with_function_level"]["components"]
                if any(m.startswith(ours) for m in c["modules"])]
    crowded = {f: v["modules"] for f, v in r["folders"].items()
               if f.startswith(("turbotrain/datasets", "turbotrain/files")) and v["modules"] > 12}
    assert crowded == {}
