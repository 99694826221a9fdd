"""stages/runtime/artifacts.py: what a killed write leaves, and reading a saved file that is damaged."""

import json
import os
import subprocess
import sys

import pytest

from pbr.errors import UserError
from stages.runtime import artifacts


def test_a_write_removes_a_dead_writers_temporary_file_not_a_live_ones(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        left = tmp_path / f".scores.npz.tmp-{dead.pid}"
        writing = tmp_path / f".scores.npz.tmp-{live.pid}"
        left.write_bytes(b"half")
        writing.write_bytes(b"being written")
        artifacts.write_bytes(tmp_path / "scores.npz", b"whole")
        assert (tmp_path / "scores.npz").read_bytes() == b"whole"
        assert not left.exists() and writing.read_bytes() == b"being written"
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["scores.npz", writing.name])
    finally:
        live.kill()
        live.wait()


def test_read_names_a_missing_or_damaged_file_and_leaves_the_machines_errors_alone(tmp_path):
    path = tmp_path / "run.json"
    with pytest.raises(UserError, match=r"run.json is missing; restore it"):
        artifacts.read_json(path)
    path.write_text('{"fingerprint": "ab')
    with pytest.raises(UserError, match=r"run.json cannot be read \(JSONDecodeError\): it is damaged"):
        artifacts.read_json(path)
    path.write_text(json.dumps(["not", "an", "object"]))
    with pytest.raises(UserError, match=r"run.json cannot be read \(ValueError\)"):
        artifacts.read_json(path)
    path.write_text(json.dumps({"fingerprint": "ab"}))
    assert artifacts.read_json(path) == {"fingerprint": "ab"}

    # a GPU that others fill, or a file this account may not read, is not a damaged file
    def oom(_):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    with pytest.raises(RuntimeError, match="CUDA out of memory"):
        artifacts.read(path, oom)
    if os.geteuid() != 0:  # root reads it anyway
        path.chmod(0)
        with pytest.raises(PermissionError):
            artifacts.read(path, lambda p: p.read_text())


def test_a_write_that_fails_midway_leaves_the_old_file_whole(tmp_path, monkeypatch):
    """A full disk while a file is rewritten: the old file stays as it was, and nothing else is left
    (a write straight to the file, which the other tests here cannot tell apart, leaves it half new)."""
    import errno

    path, folder = tmp_path / "metrics.json", tmp_path / "eval"
    artifacts.write_text(path, "old")
    with artifacts.atomic_dir(folder) as tmp:
        (tmp / "a.csv").write_text("old")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        artifacts.write_text(path, "new")
    assert path.read_text() == "old" and sorted(os.listdir(tmp_path)) == ["eval", "metrics.json"]
    with pytest.raises(OSError, match="No space left"):
        with artifacts.atomic_dir(folder) as tmp:
            (tmp / "a.csv").write_text("new")
    assert (folder / "a.csv").read_text() == "old" and sorted(os.listdir(tmp_path)) == ["eval", "metrics.json"]
