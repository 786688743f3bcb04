"""A run folder given to `eval` or `export` may be a stranger's: the dataset its config.yaml
names is printed before it is read, and a URL there is never fetched (that takes --data URL,
typed by the user). Each case runs the real command in a confined child; the URL points at a
local HTTP server (http_server.py) that counts the requests it gets."""
from __future__ import annotations

import pytest

from tests.train.tiny_data import write_tiny_dataset

from .http_server import serve
from .model_child import make_run, run_cli

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("child_processes")]

CLASSES = [f"class{k}" for k in range(4)]  # tiny_data's


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_tiny_dataset(tmp_path_factory.mktemp("data") / "ds")


def test_eval_does_not_fetch_a_url_the_run_folder_names(dataset, tmp_path):
    with serve(dataset) as server:
        run = make_run(tmp_path / "run", server.url, CLASSES)
        ran = run_cli("eval", "--run", run, "--device", "cpu", cwd=tmp_path)
        assert server.requests == []
    assert ran.error_line("turbotrain eval: error: ") == (
        f"turbotrain eval: error: {run / 'config.yaml'} names the dataset {server.url}: a URL "
        f"from a run folder is not fetched; pass --data {server.url} to evaluate on it")


def test_eval_fetches_a_url_the_user_passes(dataset, tmp_path):
    with serve(dataset) as server:
        run = make_run(tmp_path / "run", server.url, CLASSES)
        ran = run_cli("eval", "--run", run, "--data", server.url, "--device", "cpu",
                      cwd=tmp_path, env=None)
        assert ran.returncode == 0, ran.stderr[-3000:]
        assert any(r[1] == "dataset.json" for r in server.requests)


def test_export_does_not_fetch_a_url_the_run_folder_names(dataset, tmp_path):
    with serve(dataset) as server:
        run = make_run(tmp_path / "run", server.url, CLASSES)
        ran = run_cli("export", "--run", run, "--format", "safetensors", cwd=tmp_path)
        assert server.requests == []
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "checked on 16 random images" in ran.stdout


def test_a_local_path_from_the_run_folder_is_shown_before_it_is_read(dataset, tmp_path):
    run = make_run(tmp_path / "run", dataset, CLASSES)
    ran = run_cli("eval", "--run", run, "--device", "cpu", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout.splitlines()[0] == (f"data: {dataset} (from {run / 'config.yaml'}; "
                                          "--data chooses another)")
