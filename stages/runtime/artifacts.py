"""Atomic writes: a reader sees the old artifact or the complete new one, never a part."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from pbr.errors import UserError


def _writable_parent(path: Path) -> None:
    parent = path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create folder {parent} ({e.strerror}); choose a writable location") from None
    if not os.access(parent, os.W_OK):
        raise UserError(f"folder {parent} is not writable; fix its permissions")


def writable_folder(folder: Path) -> None:
    """`folder` made if missing and writable, else one line naming it (a file in its way, no permission)."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise UserError(f"{folder} is a file where an output folder goes; move it away")
    _writable_parent(folder / "x")


def write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    if path.is_dir():  # os.replace would fail naming the temporary file
        raise UserError(f"{path} is a folder; give a file's path")
    _writable_parent(path)
    clean_stale(path)  # a killed writer's temporary file (git would list it, `git add` take it)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def save_torch(obj, path: Path) -> None:
    """torch.save, with a failed write (a full disk, a quota) an OSError naming the file, as Python's own
    writes fail: torch reports it as a RuntimeError of its C++ writer ("unexpected pos ...")."""
    import errno

    import torch

    try:
        torch.save(obj, path)
    except RuntimeError as e:
        if "inline_container" not in str(e) and "PytorchStreamWriter" not in str(e):
            raise
        raise OSError(errno.EIO, f"writing it failed ({str(e).splitlines()[0].strip()})", str(path)) from None


RESTORE = "restore it with `dvc checkout --force`, or delete it and run `dvc repro`"


def read_json(path: Path, fix: str = RESTORE) -> dict:
    """A JSON object (run.json, accuracy.json), read as `read` reads."""
    import json

    def obj(p: Path) -> dict:
        value = json.loads(p.read_text())
        if not isinstance(value, dict):
            raise ValueError("not a JSON object")
        return value

    return read(path, obj, fix)


def _not_the_file(e: BaseException) -> bool:
    """Errors of the machine, not of the file's bytes: no memory (a GPU others fill), no permission."""
    return (isinstance(e, (MemoryError, PermissionError)) or type(e).__name__ == "OutOfMemoryError"
            or "CUDA" in str(e) or "out of memory" in str(e))


def read(path: Path, reader, fix: str = RESTORE):
    """`reader(path)`, a missing or damaged file (cut short, overwritten) as one line naming it."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path} is missing; {fix}")
    try:
        return reader(path)
    except UserError:
        raise
    except Exception as e:  # unpickling, JSON, parquet and zip readers each fail their own way
        if _not_the_file(e):
            raise
        raise UserError(f"{path} cannot be read ({type(e).__name__}): it is damaged; {fix}") from None


def write_text(path: Path, text: str) -> None:
    write_bytes(path, text.encode())


def write_csv(path: Path, rows: list[dict]) -> None:
    import csv
    import io

    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    write_text(path, out.getvalue())


def clean_stale(path: Path) -> None:
    """Remove what an interrupted write left beside `path` (`.NAME.tmp-PID`, `.NAME.old-PID`), not what
    a live process is writing there (two queue workers can write one file of the shared resume store)."""
    path = Path(path)
    if path.parent.is_dir():
        for p in path.parent.glob(f".{path.name}.*-*"):
            pid = p.name.rsplit("-", 1)[1]
            if pid.isdigit() and int(pid) != os.getpid() and _alive(int(pid)):
                continue
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _sync_tree(folder: Path) -> None:
    for f in sorted(folder.rglob("*")):
        if f.is_file() and not f.is_symlink():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


@contextlib.contextmanager
def atomic_dir(path: Path):
    """Yield an empty temporary folder; on success it replaces `path` in one rename."""
    path = Path(path)
    _writable_parent(path)
    clean_stale(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.mkdir()
    try:
        yield tmp
        _sync_tree(tmp)  # on disk before the rename makes it a finished folder (a power cut, not only a kill)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = path.with_name(f".{path.name}.old-{os.getpid()}")
    if path.exists():
        os.replace(path, old)
    os.replace(tmp, path)
    shutil.rmtree(old, ignore_errors=True)
