"""untrusted.py: regular files only, size caps, paths kept in their root, inflation budgets."""
import os

import pytest

from turbotrain.files.untrusted import (INFLATE_FLOOR_BYTES, MIB, InflateBudget, Limits,
                                        UnsafeInput, is_inside, open_regular, outside_root_reason,
                                        read_regular)


def test_reads_a_regular_file_up_to_the_cap(tmp_path):
    path = tmp_path / "a.bin"
    path.write_bytes(b"x" * 100)
    assert read_regular(path, 100) == b"x" * 100
    with pytest.raises(UnsafeInput, match="over the"):
        read_regular(path, 99)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("kind, reason", [("fifo", "a named pipe"), ("device", "a device"),
                                          ("folder", "a folder")])
def test_special_files_are_refused_without_blocking(tmp_path, kind, reason):
    path = tmp_path / "x"
    if kind == "fifo":
        os.mkfifo(path)  # open() without O_NONBLOCK would wait for a writer forever
    elif kind == "device":
        path.symlink_to("/dev/zero")
    else:
        path.mkdir()
    with pytest.raises(UnsafeInput, match=f"is {reason}, not a regular file"):
        open_regular(path)


def test_inside_and_outside_the_root(tmp_path):
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "in.png").write_bytes(b"")
    (tmp_path / "out.png").write_bytes(b"")
    (root / "link-in").symlink_to(root / "sub" / "in.png")
    (root / "link-out").symlink_to(tmp_path / "out.png")
    (tmp_path / "root-evil").mkdir()  # a sibling whose name starts with the root's
    assert is_inside(root / "sub" / "in.png", root) and is_inside(root / "link-in", root)
    assert is_inside(root / "sub" / ".." / "sub" / "in.png", root)
    for path in (root / "link-out", root / ".." / "out.png", "/etc/passwd",
                 tmp_path / "root-evil"):
        assert not is_inside(path, root)
    assert "--allow-outside-root" in outside_root_reason(root / "link-out", root)
    assert outside_root_reason(root / "link-in", root) is None


def test_inflate_budget_by_ratio_and_by_cap(tmp_path):
    limits = Limits(max_array_bytes=1 << 40, max_inflate_ratio=100)
    budget = InflateBudget(tmp_path / "a.gz", 10 * MIB, limits)  # may inflate to 1,000 MiB
    budget.charge(600 * MIB, "first")
    with pytest.raises(UnsafeInput, match="more than 100x its size .*--max-inflate-ratio"):
        budget.charge(500 * MIB, "second")
    small = InflateBudget(tmp_path / "b.gz", 1000, limits)  # the floor applies
    small.charge(INFLATE_FLOOR_BYTES, "all of it")
    capped = InflateBudget(tmp_path / "c.npz", 1 << 30,
                           Limits(max_array_bytes=200 * MIB, max_inflate_ratio=100))
    with pytest.raises(UnsafeInput, match="over the 200 MiB limit .*--max-array-mb"):
        capped.charge(201 * MIB, "images")
    with pytest.raises(UnsafeInput, match="negative"):
        capped.charge(-1, "labels")
