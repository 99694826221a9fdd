"""Finished tasks kept outside DVC's outputs, so that a killed `dvc exp run` resumes too.

`dvc exp run` checks the baseline's outputs out (a forced `dvc checkout`) before it reproduces: that
replaces artifacts/train, `persist` or not, and with it the tasks a killed run had finished. So the
train stage also links every finished task into `<repo>/.pbr/resume/<fingerprint>/` (git-ignored,
not a DVC output; shared by the `dvc queue` workspaces, which live under the same repository), and
takes them back from there when its output folder holds fewer of them. A trained run's folder goes
when its evaluation ends (stages/pipeline/trained.py), not when training ends: DVC commits the
train stage's outputs after the process exits, and a `dvc exp run` killed in between, or while
scoring (which a rerun's forced checkout undoes too), would otherwise retrain from the first task.
Deleting `.pbr/` at any time loses nothing else. Hard links: no second copy on disk.
The score stage keeps each scored task in a store of its own fingerprint the same way (stages/pipeline/score.py).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Callable

from stages.runtime import artifacts
from stages.runtime.paths import anchor

STORE = Path(".pbr/resume")


def store_for(fp: str) -> Path:
    return anchor() / STORE / fp[:24]


def _link(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system, or no hard links there
        shutil.copy2(src, dst)


def _link_into(src: Path, dst: Path) -> None:
    if src.is_dir():
        shutil.copytree(src, dst, copy_function=_link)
    else:
        _link(src, dst)


def keep(out: Path, name: str, fp: str) -> None:
    """Link `out/name` (a finished task's folder, or run.json) into the run's store, replacing it."""
    store = store_for(fp)
    store.mkdir(parents=True, exist_ok=True)
    tmp, dst = store / f".{name}.tmp-{os.getpid()}", store / name
    shutil.rmtree(tmp, ignore_errors=True) if tmp.is_dir() else tmp.unlink(missing_ok=True)
    _link_into(out / name, tmp)
    if dst.is_dir():
        shutil.rmtree(dst)
    os.replace(tmp, dst)


def restore(out: Path, fp: str, have: int, finished: Callable[[Path], int]) -> int:
    """When the store holds more finished tasks of this run than `out` (`have`), make `out` a copy
    of the store and return how many tasks it holds; else leave `out` alone and return 0."""
    store = store_for(fp)
    run = store / "run.json"
    try:
        saved = json.loads(run.read_text())
        if not isinstance(saved, dict) or saved.get("fingerprint") != fp:
            return 0
    except (OSError, ValueError):  # none kept, or damaged: the store is a convenience, not a record
        return 0
    kept = finished(store)
    if kept <= have:
        return 0
    with artifacts.atomic_dir(out) as tmp:
        for k in range(kept):
            _link_into(store / f"task_{k:02d}", tmp / f"task_{k:02d}")
        _link_into(run, tmp / "run.json")
    return kept


def forget(fp: str) -> None:
    """The run's outputs are complete and committed: its tasks live there (and in DVC's cache)."""
    if fp:  # never the whole store
        shutil.rmtree(store_for(fp), ignore_errors=True)
