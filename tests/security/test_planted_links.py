"""Every file turbotrain creates is created by safe_create (O_EXCL | O_NOFOLLOW, a fresh random
name, a rename into place): a symlink planted in a run folder, OUT, a shared cache or beside a
--out FILE is never followed or reused. Each writer runs in a confined child
(planting_child.py) after links to victim files were planted under its final names and under
the pid-derived temporary names the old writers used; no victim may change. A scan of the
source keeps new writers on the same road."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.train.tiny_data import write_tiny_dataset

from .confined import REPO, run_json_script
from .planting_child import VICTIM_TEXT
from .train_child import ADDRESS_SPACE_LIMIT, PEAK_RSS_LIMIT

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("child_processes")]

CHILD = Path(__file__).with_name("planting_child.py")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_tiny_dataset(tmp_path_factory.mktemp("planted") / "ds")


@pytest.mark.parametrize("case", ["run", "eval", "predict", "export", "merge", "prepare",
                                  "cache"])
def test_no_writer_follows_a_planted_link(case, dataset, tmp_path):
    result = run_json_script(CHILD, case, tmp_path / "work", dataset,
                             address_space=ADDRESS_SPACE_LIMIT, timeout=180,
                             peak_rss=PEAK_RSS_LIMIT)
    assert result["exit"] == 0, result
    assert result["victims_changed"] == []
    assert result["not_regular"] == []  # each final name is now our own regular file


# What creates or opens a file for writing. Outside safe_create.py each is a finding, unless
# listed below with the reason it is safe.
_WRITERS = re.compile(r"""open\([^)]*["'][wax]b?\+?["']|\.write_text\(|\.write_bytes\("""
                      r"""|os\.O_CREAT|os\.O_WRONLY|os\.O_RDWR|shutil\.copy|\.touch\("""
                      # reopens its event file by name on every flush (tensorboard_events.py)
                      r"""|SummaryWriter\(""")
_ALLOWED = {
    # flock files: O_CREAT | O_NOFOLLOW, never written (cache_locks.open_lock)
    "turbotrain/datasets/remote/cache_locks.py": "os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW",
    # /dev/null over a stdout whose reader has gone (| head): opened, never created
    "turbotrain/process_end.py": "os.open(os.devnull, os.O_WRONLY)",
}


def test_only_safe_create_creates_files():
    found = []
    for path in sorted((REPO / "turbotrain").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel == "turbotrain/files/safe_create.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if _WRITERS.search(code) and not (rel in _ALLOWED and _ALLOWED[rel] in code):
                found.append(f"{rel}:{number}: {line.strip()}")
    assert found == [], "create files through turbotrain/files/safe_create.py:\n" + \
        "\n".join(found)


def test_a_link_put_over_the_event_file_mid_run_is_never_written_through(tmp_path):
    """TensorBoard's own writer opens its event file again by name at every flush: whoever can
    write into the run folder sees the name once it exists, puts a link there, and the next
    flush appends to the victim. Ours writes through the descriptor it created."""
    from turbotrain.train.records import report
    victim = tmp_path / "victim"
    victim.write_text(VICTIM_TEXT)
    run = tmp_path / "run"
    run.mkdir()
    log = report.MetricsLog(run, tensorboard=True)
    log.write({"kind": "step", "epoch": 0, "step": 1, "loss": 1.0})
    [events] = (run / "tensorboard").iterdir()
    events.unlink()
    events.symlink_to(victim)
    for step in range(2, 40):
        log.write({"kind": "step", "epoch": 0, "step": step, "loss": 1.0 / step})
    log.close()
    assert victim.read_text() == VICTIM_TEXT
