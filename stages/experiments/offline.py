"""`pbr sweep NAME --offline DIR`: a sweep's runs without DVC or a tracking server.

For a machine that has the code and the data but no DVC queue and no reachable MLflow (a GPU
box, an air-gapped compute node): each run gets its own folder `DIR/runs/<name>/` holding its
params.yaml, its artifacts and reports, and runs `pbr train` then `pbr evaluate` there. Every run
records to one sqlite MLflow store in the folder (`DIR/mlflow.db`, artifacts in `DIR/mlartifacts/`),
or, where MLflow is not installed (or with `--record files`), to plain files in `DIR/journal/`
(stages/runtime/journal.py), with the code commit of the project it was started from. `pbr import
DIR` copies the runs into the project's store later, where `pbr report` shows them like any other.

A finished run leaves `DIR/runs/<name>/DONE` (its metrics, and a stamp of its params and training
code); a second call skips it while both are the same, and a run killed part-way resumes from its
finished tasks (the train stage's own resume).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import yaml

from pbr.errors import UserError
from stages.runtime.paths import from_repo
from stages.runtime.yaml12 import read_params

DONE = "DONE"


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")  # two sweeps in one folder never share one
    tmp.write_text(text)
    tmp.replace(path)


def _lock(path: Path, wait: bool):
    """An exclusive lock on `path` (made if missing) for as long as the returned file stays open; None
    when another process holds it and `wait` is False. Where the file system has no locks (some
    Lustre and NFS mounts) it is the open file all the same: sweeps there must not share runs."""
    import fcntl

    f = open(path, "a")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        f.close()
        return None
    except OSError:  # no locks here (ENOSYS, ENOLCK)
        pass
    return f


RECORD = ("auto", "mlflow", "files")


def mlflow_installed() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("mlflow") is not None
    except (ImportError, ValueError):  # a blocked import (sys.modules["mlflow"] = None)
        return False


JOURNAL_DIR = "journal"


def store_uri(out: Path, record: str) -> str:
    """Where the runs of `out` record: its sqlite MLflow store (`record` mlflow) or plain files in
    journal/ (files); auto: as the folder already does, else files where MLflow is not installed
    (a GPU box's bare image)."""
    from stages.runtime import journal

    if record not in RECORD:
        raise UserError(f"--record {record}: give one of {', '.join(RECORD)}")
    # A folder keeps the way it started recording (its runs are imported from one place).
    has = "mlflow" if (out / "mlflow.db").is_file() else "files" if (out / JOURNAL_DIR).is_dir() else None
    if record == "auto":
        record = has or ("mlflow" if mlflow_installed() else "files")
    if has is not None and has != record:
        raise UserError(f"--record {record}: {out} already holds runs recorded "
                        f"{'in mlflow.db' if has == 'mlflow' else 'to plain files'}; use another --offline folder")
    if record == "mlflow" and not mlflow_installed():
        if has == "mlflow":
            raise UserError(f"--offline {out}: it records to mlflow.db, which needs MLflow, not installed here: "
                            "install it, or give another --offline folder (plain files there)")
        raise UserError("--record mlflow: MLflow is not installed here; use --record files (or auto) and "
                        "`pbr import` the folder where it is")
    return journal.uri(out / JOURNAL_DIR) if record == "files" else f"sqlite:///{out / 'mlflow.db'}"


def _env(out: Path, root: Path, store: str) -> dict[str, str]:
    from stages.runtime.tracking import git_state

    git = git_state(root)
    # The runs execute outside the project: its code comes first on the path, and its commit (the
    # code's checkout's, not the folder the sweep was started from) is recorded on every run.
    path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "MLFLOW_TRACKING_URI": store, "PYTHONPATH": path,
            "PBR_GIT_COMMIT": git["git.commit"], "PBR_GIT_DIRTY": git["git.dirty"]}


def _params(base: dict, overrides: dict[str, Any]) -> dict:
    from stages.experiments.sweep import _merged

    p = _merged(base, overrides)
    # A relative data root is the project's, not the run folder's.
    p.setdefault("data", {})["root"] = str(from_repo(p.get("data", {}).get("root", "data/raw")))
    return p


def _script(*commands: str) -> str:
    """The shell line running `pbr` COMMANDS in turn with this interpreter (quoted: a virtualenv under
    a folder with a space in its name)."""
    return " && ".join(f"{shlex.quote(sys.executable)} -m stages.cli {c}" for c in commands)


def _stage(cmd: str, cwd: Path, env: dict[str, str], log_file: Path) -> int:
    """`pbr cmd` in `cwd`, waited for; stopped as a run is (_stop) when the sweep is."""
    with open(log_file, "a") as log:
        log.write(f"\n$ pbr {cmd}\n")
    proc = None
    try:
        proc = _spawn(_script(cmd), cwd, env, log_file)
        return proc.wait()
    except BaseException:
        if proc is not None:
            _stop([proc])
        raise


def _project_prepared(params: dict) -> Path | None:
    """The project's own data/prepared (from `dvc pull`, or copied) when it was prepared with `params`'
    data settings and no raw data is at data.root to prepare from (a GPU box that pulled the prepared
    data and not the archive); None otherwise. The train stage checks every shard's hash."""
    from pbr.data.sources import raw_present
    from stages.runtime import paths
    from stages.runtime.config import from_dict, refuse_stale

    local = from_repo(paths.PREPARED)
    cfg = from_dict(params)
    try:
        refuse_stale(cfg, json.loads((local / "manifest.json").read_text()))  # the train stage's own check
    except (OSError, ValueError, AttributeError, UserError):
        return None
    return None if raw_present(cfg.data.dataset, from_repo(cfg.data.root)) else local


def _drop_dangling(link: Path) -> None:
    """A link left pointing nowhere (the project's data/prepared removed, the folder moved) is made again."""
    if link.is_symlink() and not link.exists():
        link.unlink()


def _prepared(out: Path, params: dict, env: dict[str, str], log: Callable[[str], None] = print) -> Path:
    """The prepared data of `params`' data section, built once per distinct section (or the project's
    own, where it matches and there is no raw data: _project_prepared)."""
    key = hashlib.sha256(json.dumps(params["data"], sort_keys=True).encode()).hexdigest()[:12]
    home = out / "data" / key
    home.mkdir(parents=True, exist_ok=True)
    with _lock(home / ".lock", wait=True):  # another sweep in this folder preparing it: wait, then use it
        return _prepare_once(home, params, env, log)


def _prepare_once(home: Path, params: dict, env: dict[str, str], log: Callable[[str], None]) -> Path:
    _drop_dangling(home / "data" / "prepared")
    if not (home / "data" / "prepared" / "manifest.json").is_file():
        local = _project_prepared(params)
        if local is not None:
            log(f"no raw data at {params['data'].get('root')}: the runs use the project's {local} (prepared with "
                "the same data settings)")
            (home / "data").mkdir(parents=True, exist_ok=True)
            (home / "data" / "prepared").symlink_to(local)
            return home / "data" / "prepared"
        home.mkdir(parents=True, exist_ok=True)
        _write(home / "params.yaml", yaml.safe_dump(params, sort_keys=False))
        if _stage("prepare", home, env, home / "prepare.log") != 0:
            raise UserError(f"pbr prepare failed for the data section {params['data']}; see {home / 'prepare.log'}")
    return home / "data" / "prepared"


def _link_data(d: Path, out: Path, params: dict, env: dict[str, str], log: Callable[[str], None] = print) -> None:
    """The run folder `d`'s data/prepared: a link to its data section's prepared data. A link to other
    data (the data section changed since the run started, or the folder moved) is made again: the run
    trains on what its params.yaml says, and its train stage starts over if that is new data."""
    link = d / "data" / "prepared"
    target = _prepared(out, params, env, log)
    if link.is_symlink() and os.readlink(link) != str(target):
        link.unlink()
    if not link.exists():
        link.parent.mkdir(exist_ok=True)
        link.symlink_to(target)


def _start(run, out: Path, base: dict, env: dict[str, str], log: Callable[[str], None] = print,
           keep: tuple[int, ...] = ()) -> subprocess.Popen | None:
    d = out / "runs" / run.name
    d.mkdir(parents=True, exist_ok=True)
    params = _params(base, run.overrides)
    _write(d / "params.yaml", yaml.safe_dump(params, sort_keys=False))
    _link_data(d, out, params, env, log)
    script = _script("train", "evaluate")
    # Named in MLflow as the sweep names it (as a queued DVC experiment would be).
    return _spawn(script, d, {**env, "DVC_EXP_NAME": run.name}, d / "run.log", keep)


def _spawn(script: str, cwd: Path, env: dict[str, str], log_file: Path, keep: tuple[int, ...] = ()
           ) -> subprocess.Popen:
    """`sh -c script` in its own process group, so that the sweep can stop the run's stages, not only
    its shell (_stop). The child keeps its own copy of the log's descriptor: ours is closed at once
    (a long sweep opens no pile of files), and of `keep` (the run folder's lock: a sweep killed
    outright leaves its run's stages going, and the lock with them, so no other sweep starts it too)."""
    with open(log_file, "a") as log:
        return subprocess.Popen(["sh", "-c", script], cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=_interruptible, pass_fds=keep)


def _interruptible() -> None:
    """In the run's process, before its shell starts: a sweep started in the background of a script
    (or a CI job) has SIGINT ignored, which its children would inherit, and then _stop's interrupt
    would not reach the stage."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextlib.contextmanager
def kills_interrupt():
    """SIGTERM (`kill`) and SIGHUP (a closed terminal) stop the sweep as Ctrl-C does, its runs, its
    prepare stages and its MPS daemon with it: they run in sessions of their own, so by default they
    would outlive it. Only where the signal has its default action (`nohup` keeps SIGHUP ignored) and
    in the main thread; nested, the outer one holds."""
    import threading

    def interrupt(signum, frame):
        for sig in saved:  # a second kill is ignored rather than cutting the clean-up short
            signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt

    saved: dict = {}
    if threading.current_thread() is threading.main_thread():
        # pbr's main() turns a default action into Ctrl-C's; this one takes over from it.
        saved = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)
                 if signal.getsignal(sig) in (signal.SIG_DFL, signal.default_int_handler)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def done_line(name: str, seconds: float, metrics: dict) -> str:
    """A finished run's line, from its metrics.json (PNN's has no Class-IL block: no such prediction)."""
    c = f"{metrics['class_il']['acc']:.2f}" if "class_il" in metrics else "-"
    return f"done {name} in {seconds:.0f} s: Class-IL {c}, Task-IL {metrics['task_il']['acc']:.2f}"


def _stop(procs: list[subprocess.Popen]) -> None:
    """Interrupt the runs still going (their stages record the run KILLED and exit; the next call
    resumes them from their finished tasks), and wait for them."""
    def signal_group(proc: subprocess.Popen, sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass

    for proc in procs:
        signal_group(proc, signal.SIGINT)
    for proc in procs:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            signal_group(proc, signal.SIGKILL)
            proc.wait()


def stamp(params: dict) -> str:
    """What a finished run was finished under: its params (where its data lies aside) and the code
    that shapes the trained weights (the train stage's own fingerprint hashes the same code). Under
    another stamp the name is no longer that run: a committed edit of params.yaml (DVC's queue,
    which names runs per commit, runs them again too) or of the training code."""
    from stages.runtime.paths import code_hash
    from stages.runtime.config import NOT_CONTENT

    content = {**params, "data": {k: v for k, v in params.get("data", {}).items() if k not in NOT_CONTENT}}
    blob = json.dumps({"params": content, "code": code_hash()}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def finished(d: Path, mark: str) -> bool:
    """DONE under this stamp (a DONE from before stamps were written counts: nothing says otherwise)."""
    try:
        got = json.loads((d / DONE).read_text()).get("stamp", mark)
    except (OSError, ValueError, AttributeError):
        return False
    return got == mark


def _finish(run, out: Path, rc: int, seconds: float, mark: str) -> dict | None:
    d = out / "runs" / run.name
    metrics = d / "reports" / "metrics.json"
    if rc != 0 or not metrics.is_file():
        return None
    m = json.loads(metrics.read_text())
    _write(d / DONE, json.dumps({"seconds": round(seconds, 1), "stamp": mark, **m}, indent=1))
    return m


# A bad store (say an experiment name plain files cannot hold) is the child's one-line UserError.
_INIT_STORE = """import sys
from pbr.errors import UserError
from stages.runtime import tracking
try:
    tracking.init_store()
except UserError as e:
    sys.exit(" ".join(str(e).split()))
"""


def _order(runs) -> list:
    """Seed by seed, so that a sweep cut short leaves every row with the same seeds."""
    return sorted(runs, key=lambda r: r.overrides.get("seed", 0))


def run_all(runs: list, out: Path, params_file: Path, jobs: int = 1,
            log: Callable[[str], None] = print, record: str = "auto") -> tuple[int, int, list[str]]:
    """Run `runs` (sweep.Run) in `out`, `jobs` at a time, recording as `record` says (store_uri);
    returns (finished now, skipped, failed names)."""
    if jobs < 1:
        raise UserError(f"--jobs {jobs}: give at least 1 with --offline")
    out = out.expanduser().resolve()
    (out / "runs").mkdir(parents=True, exist_ok=True)
    with kills_interrupt():
        return _run_all(runs, out, params_file, jobs, log, record)


def _run_all(runs: list, out: Path, params_file: Path, jobs: int, log: Callable[[str], None],
             record: str) -> tuple[int, int, list[str]]:
    from stages.runtime import journal

    root = Path(__file__).resolve().parents[2]  # the checkout whose code the runs use
    base = read_params(params_file)
    store = store_uri(out, record)
    env = _env(out, root, store)
    records = out / "mlflow.db" if store.startswith("sqlite:") else out / JOURNAL_DIR
    if store.startswith(journal.SCHEME):
        log(f"recording to plain files in {records}; on a machine with MLflow, `pbr import {shlex.quote(str(out))}` "
            "copies the runs into its store")
    # The store and its artifact folder are made once, from `out`, before parallel runs open it (and
    # follow a move of the folder: tracking.follow_move).
    made = subprocess.run([sys.executable, "-c", _INIT_STORE], cwd=out, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    if made.returncode != 0:
        last = (made.stderr.strip().splitlines() or [f"exit {made.returncode}"])[-1]
        raise UserError(f"--offline {out}: the runs' store could not be made: {last}")
    marks = {r.name: stamp(_params(base, r.overrides)) for r in runs}
    todo = _order(r for r in runs if not finished(out / "runs" / r.name, marks[r.name]))
    for r in todo:
        if (out / "runs" / r.name / DONE).is_file():
            log(f"{r.name}: finished under other params or training code; run again")
    # Every data section is prepared before any run starts: one that fails leaves no run behind. The
    # prepare stage records as part of the first run that needs its data (that run's stages join it).
    for r in todo:
        _prepared(out, _params(base, r.overrides), {**env, "DVC_EXP_NAME": r.name}, log)
    skipped, done, failed, elsewhere = len(runs) - len(todo), 0, [], 0
    # Each live run holds its folder's lock: sweeps sharing this folder (disjoint shards, say) never
    # start the same run twice; a run another one holds is left to it.
    live: dict[str, tuple[Any, subprocess.Popen, float, Any]] = {}
    try:
        while todo or live:
            while todo and len(live) < jobs:
                r = todo.pop(0)
                d = out / "runs" / r.name
                d.mkdir(parents=True, exist_ok=True)
                lock = _lock(d / ".lock", wait=False)
                if lock is None or finished(d, marks[r.name]):  # running, or finished meanwhile, in another sweep
                    if lock is None:
                        elsewhere += 1
                        log(f"{r.name}: another sweep in {out} is running it; left to that one")
                    else:
                        lock.close()
                        skipped += 1
                    continue
                (d / DONE).unlink(missing_ok=True)  # another stamp's: this run is not finished until it says so
                live[r.name] = (r, _start(r, out, base, env, log, keep=(lock.fileno(),)), time.time(), lock)
                log(f"started {r.name}")
            time.sleep(1.0)
            for name, (r, proc, t0, lock) in list(live.items()):
                if proc.poll() is None:
                    continue
                del live[name]
                m = _finish(r, out, proc.returncode, time.time() - t0, marks[name])
                lock.close()
                if m is None:
                    failed.append(name)
                    log(f"FAILED {name} (exit {proc.returncode}); see {out / 'runs' / name / 'run.log'}")
                else:
                    done += 1
                    log(done_line(name, time.time() - t0, m))
    finally:  # Ctrl-C, a kill, or an error of the sweep's own: the runs it started stop with it
        _stop([proc for _, proc, _, _ in live.values()])
        for r, proc, t0, lock in live.values():  # one that ended before the interrupt was seen is done all the same
            _finish(r, out, proc.returncode, time.time() - t0, marks[r.name])
            lock.close()
    log(f"{done} run{'s' * (done != 1)} finished, {skipped} already done, {len(failed)} failed"
        + (f", {elsewhere} left to another sweep in this folder" if elsewhere else "")
        + f"; records in {records}: copy {out} to the project and run `pbr import {shlex.quote(str(out))}`")
    return done, skipped + elsewhere, failed
