"""A throw-away copy of the project (git + DVC initialised) for end-to-end `dvc repro` tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
COPY = ["pbr", "stages", "dvc.yaml", "params.yaml", ".dvcignore", ".gitignore", "pyproject.toml"]


def env() -> dict:
    e = dict(os.environ)
    e["PATH"] = f"{BIN}{os.pathsep}{e.get('PATH', '')}"
    e.update(DVC_NO_ANALYTICS="1", GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
             GIT_COMMITTER_EMAIL="t@t")
    return e


def run(cmd: list[str] | str, cwd: Path, check: bool = True, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, cwd=cwd, env=env(), capture_output=True, text=True, shell=isinstance(cmd, str), **kw)
    if check and r.returncode != 0:
        raise AssertionError(f"{cmd} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


def set_params(repo: Path, **dotted) -> None:
    p = repo / "params.yaml"
    params = yaml.safe_load(p.read_text())
    for key, value in dotted.items():
        d = params
        *heads, last = key.split("__")
        for h in heads:
            d = d[h]
        d[last] = value
    p.write_text(yaml.safe_dump(params, sort_keys=False))


def make_project(dest: Path, **params) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for name in COPY:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.exists():
            shutil.copy2(src, dest / name)
    set_params(dest, **params)
    run(["git", "init", "-q", "-b", "main"], dest)
    run([str(BIN / "dvc"), "init", "-q"], dest)
    run(["git", "add", "-A"], dest)
    run(["git", "commit", "-q", "-m", "init"], dest)
    return dest


def dvc(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return run([str(BIN / "dvc"), *args], repo, check=check)
