"""A throw-away copy of the project (git + DVC initialised) for end-to-end `dvc repro` tests."""

from __future__ import annotations

import contextlib
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
    # One torch thread per process: tests run side by side (pytest-xdist, queue workers), and
    # oversubscribed OpenMP threads slow everything down many times over.
    e.setdefault("OMP_NUM_THREADS", "1")
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


def copy_project(src: Path, dest: Path) -> Path:
    """An independent copy of a project (git history, DVC cache, outputs, MLflow store) to change."""
    shutil.copytree(src, dest, symlinks=True)
    return dest


def commit(repo: Path, message: str) -> None:
    run(["git", "add", "-A"], repo)
    run(["git", "commit", "-q", "-m", message], repo)


# The small configuration of the end-to-end tests: generated CIFAR-10 (10 classes x 60, IR 0.1),
# ResNet18 of width 4, PBR, 2 epochs per task (so a kill can land inside a task). fp32, not the
# default auto: the same numbers on CI machines with and without bf16 units.
SMALL = dict(data__download=False, data__imbalance_ratio=0.1, model__width=4, train__epochs=2,
             train__device="cpu", train__precision="fp32", train__eval_batch_size=256, method__pbr__mc_samples=4)


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every file under `root` (relative path -> content), to compare two trees byte for byte."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def finished_project(tmp: Path) -> Path:
    """A project after one complete `dvc repro` of the whole pipeline, results committed."""
    import fakedata

    raw = tmp / "raw"
    fakedata.write_cifar(raw, 10, 60, 6)
    repo = make_project(tmp / "finished", data__root=str(raw), **SMALL)
    dvc(repo, "repro")
    commit(repo, "results")
    return repo


# MLflow 3's server also starts a job runner and four huey consumers (GenAI jobs, which nothing here
# uses): eight more processes, ~18 CPU s at start-up and polling after, on CI's two cores. And one
# worker, not four, for one test's requests (`pbr ui` starts `mlflow ui` at its default, which reads
# MLFLOW_WORKERS): 7 processes and 22 CPU s at start against 2 and about 9.
NO_SERVER_JOBS = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_WORKERS": "1"}


def assert_links_this_execution(tags: dict, repo: Path) -> None:
    """A finished run's dvc.md5.* tags are the md5s dvc.lock holds after its execution, for the stages
    evaluate reads (prepare, train); the others are not tagged (while evaluate runs, their lock entries
    may be an earlier execution's)."""
    lock = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]
    assert {"prepare", "train", "score", "evaluate"} <= set(lock)
    for stage, entry in lock.items():
        for out in entry.get("outs", []):
            want = out["md5"] if stage in ("prepare", "train") else None
            assert tags.get(f"dvc.md5.{out['path']}") == want, (stage, out)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def mlflow_server(tmp: Path, *args: str, extra_env: dict | None = None):
    """A real `mlflow server` on loopback (sqlite backend, proxied artifacts); yields its URI."""
    import signal
    import time
    import urllib.error
    import urllib.request

    port = free_port()
    server = subprocess.Popen(
        [str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{tmp / 'server.db'}", "--artifacts-destination", str(tmp / "server-artifacts"),
         *args], env={**env(), **NO_SERVER_JOBS, **(extra_env or {})}, stdout=subprocess.DEVNULL,
        stderr=open(tmp / "server.log", "w"), start_new_session=True)
    try:
        uri = f"http://127.0.0.1:{port}"
        deadline = time.time() + 120
        while True:
            try:
                urllib.request.urlopen(f"{uri}/health", timeout=2)
                break
            except urllib.error.HTTPError:  # up, and asking for credentials
                break
            except OSError:
                if time.time() > deadline or server.poll() is not None:
                    raise AssertionError("mlflow server did not start:\n" + (tmp / "server.log").read_text()[-2000:])
                time.sleep(0.5)
        yield _Server(uri, server)
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)


class _Server(str):
    """The server's URI, which can also stop it (a server gone while a stage records to it)."""

    def __new__(cls, uri: str, proc: subprocess.Popen):
        s = super().__new__(cls, uri)
        s.proc = proc
        return s

    def stop(self) -> None:
        import signal

        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(timeout=30)


def queue_states(repo: Path) -> list[tuple[str, str]]:
    """(name, status) of every task of the repository's DVC queue, from `dvc queue status`."""
    rows = []
    for line in dvc(repo, "queue", "status").stdout.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[-1] in ("Queued", "Running", "Success", "Failed"):
            rows.append((parts[1], parts[-1]))
    return rows
