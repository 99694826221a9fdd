"""MLflow tracking: one run per pipeline execution, shared by its stages.

Every stage (a separate process under `dvc repro`) opens the execution's run with `stage_run`.
The run is found by a key (hash of params.yaml and the git commit): a stage joins the newest
run with that key that has not yet recorded this stage, and starts a new run otherwise. Between
stages the run is FINISHED; while a stage executes it is RUNNING with the stage's pid, so a
killed stage is recognised by the next stage that starts (any pipeline) and marked KILLED.

The default store is sqlite at the repository root. `dvc exp run --queue` workers execute in
copies under `<repo>/.dvc/tmp/exps/`; the store is anchored to `<repo>` so they all share it.
`MLFLOW_TRACKING_URI` overrides the store (a `mlflow server`, for example); `journal:DIR` records
to plain files in DIR instead, on a machine without MLflow (stages/runtime/journal.py, for
`pbr import` later).

A server that cannot be reached (refused, unknown host, no answer within a couple of seconds) does
not fail the user's training: the stage records to the offline store `<repo>/mlflow-offline/`
instead, says so in one line, and `pbr import mlflow-offline` copies its runs to the server later
(docs/offline.md). `PBR_OFFLINE=1` (or `MLFLOW_TRACKING_URI=offline`) records there without trying
the server. A server that answers, even with 401/403, is used: its errors stay errors.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from pbr.errors import UserError
from stages.runtime.paths import TRAIN, anchor, from_repo, repo_root

EXPERIMENT = "pbr"
OFFLINE_DIR = "mlflow-offline"  # at the repository root, beside mlflow.db
CONNECT_TIMEOUT_S = 2.0


def offline_uri(cwd: Path | None = None) -> str:
    return f"sqlite:///{repo_root(cwd) / OFFLINE_DIR / 'mlflow.db'}"


def _remote(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


def tracking_uri(cwd: Path | None = None) -> str:
    """The store named by the environment; see recording_uri for the one a stage records to."""
    uri = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
    if uri and "://" not in uri and uri.lower() != "offline" and not uri.startswith(("journal:", "file:", "databricks")):
        # A bare word or path: MLflow reads it as its retired file store, with a message cut mid-word.
        from pbr.errors import UserError

        raise UserError(f"MLFLOW_TRACKING_URI={uri}: not a store this project opens; give sqlite:///PATH.db, "
                        "http(s)://HOST:PORT (a server), journal:FOLDER (plain files), or unset it for the "
                        "repository's mlflow.db")
    forced = os.environ.get("PBR_OFFLINE", "").strip().lower() in ("1", "true", "yes")
    if uri.lower() == "offline" or (forced and _remote(uri)):
        return offline_uri(cwd)
    rest = uri[len("sqlite:///"):] if uri.startswith("sqlite:///") else "/"
    if not rest.startswith("/"):
        # A relative sqlite path (MLflow's own example, sqlite:///mlflow.db) from the repository root,
        # as a journal: folder is: a `dvc queue` worker runs in a copy under .dvc/tmp/exps that DVC
        # deletes, and every queued run went into a store there.
        return f"sqlite:///{repo_root(cwd) / rest}"
    return uri or f"sqlite:///{repo_root(cwd) / 'mlflow.db'}"


_UNREACHABLE: dict[tuple[str, int], str | None] = {}  # (host, port) -> why it cannot be reached


def _connect_error(host: str, port: int, timeout: float) -> str | None:
    """Why a TCP connection to host:port fails, None when it opens. Run in a thread: a name lookup
    is not bound by the socket timeout and can hang for tens of seconds on an air-gapped node."""
    found: list[str | None] = []

    def attempt() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            found.append(None)
        except socket.gaierror:
            found.append(f"cannot resolve {host}")
        except TimeoutError:
            found.append(f"no answer within {timeout:g} s")
        except OSError as e:  # refused, no route to host, network unreachable
            found.append((e.strerror or type(e).__name__).lower())

    t = threading.Thread(target=attempt, daemon=True)
    t.start()
    t.join(timeout + 1.0)
    return found[0] if found else f"no answer within {timeout + 1.0:g} s"


def unreachable(uri: str, timeout: float = CONNECT_TIMEOUT_S, again: bool = False) -> str | None:
    """Why the http(s) server of `uri` (or the proxy that requests would use for it) cannot be
    reached, None when it can or `uri` names no server; checked once per process (`again`: now)."""
    import urllib.parse
    import urllib.request

    if not _remote(uri):
        return None
    u = urllib.parse.urlsplit(uri)
    host, port = u.hostname or "", u.port or (443 if u.scheme == "https" else 80)
    proxy = urllib.request.getproxies().get(u.scheme)
    if proxy and not urllib.request.proxy_bypass(host):
        p = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        host, port = p.hostname or "", p.port or 80
    if again or (host, port) not in _UNREACHABLE:
        _UNREACHABLE[host, port] = _connect_error(host, port, timeout)
    return _UNREACHABLE[host, port]


_ANNOUNCED: set[str] = set()


def recording_uri(cwd: Path | None = None) -> str:
    """The store a stage records to: tracking_uri, or the offline store when its server is unreachable."""
    uri = tracking_uri(cwd)
    why = unreachable(uri)
    if why is None:
        return uri
    offline = offline_uri(cwd)
    if uri not in _ANNOUNCED:
        _ANNOUNCED.add(uri)
        folder = repo_root(cwd) / OFFLINE_DIR
        where = OFFLINE_DIR if repo_root(cwd) == Path.cwd().resolve() else str(folder)
        print(f"MLflow server {uri} is unreachable ({why}): recording to the offline store {folder} instead; "
              f"copy its runs to the server later with `pbr import {shlex.quote(str(where))}`", file=sys.stderr,
              flush=True)
    return offline


def experiment_name() -> str:
    """$MLFLOW_EXPERIMENT_NAME, else pbr (also when it is set empty: MLflow has no experiment '')."""
    return os.environ.get("MLFLOW_EXPERIMENT_NAME", "").strip() or EXPERIMENT


def _git(*args: str, cwd: Path | None = None) -> str:
    try:
        r = subprocess.run(["git", *args], capture_output=True, text=True, timeout=20, cwd=cwd)
        return r.stdout.strip() if r.returncode == 0 else ""
    except (OSError, subprocess.TimeoutExpired):
        return ""


CODE = ("pbr", "stages", "benchmarks", "examples", "pyproject.toml", "dvc.yaml")  # what git.dirty covers


def git_state(code: Path | None = None) -> dict[str, str]:
    """The commit and dirty flag of the checkout at `code` (else the working directory's)."""
    if os.environ.get("PBR_GIT_COMMIT"):  # a run started outside the checkout (`pbr sweep --offline`)
        return {"git.commit": os.environ["PBR_GIT_COMMIT"], "git.dirty": os.environ.get("PBR_GIT_DIRTY", "unknown")}
    commit = _git("rev-parse", "HEAD", cwd=code)
    if not commit:  # no git here, or no checkout: nothing is known of its state either
        return {"git.commit": "unknown", "git.dirty": "unknown"}
    # The code only: every run changes dvc.lock and the reports, `dvc exp run -S` params.yaml (all
    # recorded on their own), so a dirty flag over the whole tree was true for nearly every run.
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no", "--", *CODE, cwd=code))
    return {"git.commit": commit, "git.dirty": str(dirty).lower()}


# The libraries whose version can move a run's numbers or records (pyarrow's is in the prepared shards'
# bytes), read from the installed metadata: none of them is imported for it.
LIBRARIES = ("torch", "numpy", "pyarrow", "mlflow", "dvc")


def library_versions() -> dict[str, str]:
    """The versions this process runs with (run.json's `versions`; the `pbr.version.*` tags)."""
    from importlib import metadata

    found = {"python": ".".join(map(str, sys.version_info[:3]))}
    for name in LIBRARIES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:  # mlflow, where a stage records to plain files
            found[name] = "none"
    return found


def pipeline_key(params_file: Path, commit: str) -> str:
    h = hashlib.sha256(Path(params_file).read_bytes())
    h.update(commit.encode())
    return h.hexdigest()[:32]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_start(pid: int) -> str:
    """When process `pid` started (clock ticks since boot, /proc/PID/stat's 22nd field), "" where
    that cannot be read: with its pid it names one process, not whichever took the pid later."""
    from stages.runtime.orphan import _stat

    try:
        st = _stat(pid)
    except (OSError, ValueError, IndexError):
        return ""
    return str(st[3]) if st is not None else ""


def runs_still(pid: int, start: str = "") -> bool:
    """Whether the process a run names (its pid, and its start time where recorded) still runs. Not
    this one, which runs no other stage: its pid was another's, reused (a restarted container)."""
    if pid == os.getpid() or not pid_alive(pid):
        return False
    now = process_start(pid) if start else ""
    return not now or now == start


@contextlib.contextmanager
def _creation_lock(uri: str) -> Iterator[None]:
    """Serialise opening a sqlite store: the first opening creates its tables, and two processes
    doing that at once (two queue workers) corrupt its migration history."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    import fcntl

    db = Path(uri.removeprefix("sqlite:///"))
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.with_name(db.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def store_error(uri: str, e: Exception, fix: str) -> str:
    """One line for a store that cannot be opened; a server that refused us says what to set."""
    msg = " ".join(str(e).split())[:160]
    if isinstance(e, ImportError):  # MLflow's own code fails to import (a dependency upgraded past it): not the store
        return (f"the MLflow installation is inconsistent ({type(e).__name__}: {msg}): run `pip check`, then "
                "reinstall the tested versions: `pip install -c constraints.txt -e .` in the checkout")
    if "invalid host header" in str(e).lower():  # MLflow 3's guard against DNS rebinding, not an account
        from urllib.parse import urlsplit

        return (f"MLflow server {uri} refused the name it was reached by ({urlsplit(uri).netloc}): add it to the "
                "server's --allowed-hosts (a comma-separated list that replaces the default localhost and private "
                "addresses: keep localhost:PORT there for local clients; docs/team.md)")
    if "401" in msg or "unauthorized" in msg.lower() or "403" in msg or "permission" in msg.lower():
        # The server's own words (an HTML page, a cut-off link) say less than who was refused.
        user = os.environ.get("MLFLOW_TRACKING_USERNAME")
        who = f"refused the account {user!r}" if user else "asks for an account"
        return (f"MLflow server {uri} {who}: set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD to your "
                "account on it")
    return f"MLflow store {uri} cannot be opened ({type(e).__name__}: {msg}); {fix}"


# MLflow 3 opens an experiment of no declared kind in its GenAI view (runs under "Evaluations").
# Releases of its UI without the "GenAI | Model training" switch read this tag to open on the
# training runs; those with it (3.17 checked) ignore the tag, and the link of ui_link sets the switch.
KIND_TAG, KIND = "mlflow.experimentKind", "custom_model_development"


# The runs the UI's link lists: those whose evaluate stage ended (`pbr report`'s); a run stopped after
# training is FINISHED too, with the same green check. The UI reads its search box from the link.
COMPLETE_FILTER = "tags.pbr.complete = 'true'"


def ui_link(base: str, experiment_id: str) -> str:
    """The MLflow UI page of an experiment's complete training runs with their metric charts."""
    from urllib.parse import quote

    return (f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs"
            f"?workflowType=machine_learning&compareRunsMode=CHART&searchFilter={quote(COMPLETE_FILTER, safe='')}")


def given_by(flag: bool) -> str:
    """What named a command's store, for its errors: its --tracking-uri (`flag`), else the environment."""
    return "--tracking-uri" if flag else "MLFLOW_TRACKING_URI"


def refuse_journal(uri: str, flag: bool = False) -> None:
    """A one-line error for a plain-file record where an MLflow store is needed (report, UI, import target)."""
    from stages.runtime import journal

    if uri.startswith(journal.SCHEME):
        folder = from_repo(journal.folder_of(uri))  # where the stages record it
        raise UserError(f"{given_by(flag)} {uri} holds runs recorded to plain files, which only `pbr import` "
                        f"reads: `pbr import {shlex.quote(str(folder))}` into an MLflow store, then use that store "
                        "(docs/offline.md)")


def store_fix(flag: bool) -> str:
    """The fix for a store a command cannot use: the flag that named it, or either way to name another."""
    return "check --tracking-uri" if flag else "check --tracking-uri / MLFLOW_TRACKING_URI"


def refuse_unreachable(uri: str, flag: bool = False) -> None:
    """A one-line error at once for a server that cannot be reached, where MLflow's client would retry
    for minutes (report, UI: nothing of theirs can fall back to the offline store)."""
    why = unreachable(uri)
    if why is not None:
        raise UserError(f"MLflow server {uri} is unreachable ({why}): start it, or {store_fix(flag)}")


def existing_experiment_id(uri: str, name: str, flag: bool = False) -> str:
    """The id of experiment `name` in the store at `uri` (named by --tracking-uri with `flag`); a
    one-line error when there is none."""
    refuse_journal(uri, flag)
    refuse_unreachable(uri, flag)
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///"):].split("?", 1)[0])
        if not db.is_file():
            raise UserError(f"no MLflow store at {uri}: run a stage first (dvc repro), or "
                            f"{'check --tracking-uri' if flag else 'set MLFLOW_TRACKING_URI'}")
        follow_move(db)  # the UI serves the runs' artifacts from where the store is now
    try:
        from mlflow import MlflowClient

        exp = MlflowClient(tracking_uri=uri).get_experiment_by_name(name)
    except Exception as e:  # a store that cannot be opened fails in many ways
        raise UserError(store_error(uri, e, store_fix(flag))) from None
    if exp is None:
        raise UserError(f"MLflow store {uri} has no experiment '{name}': run a stage first (dvc repro), or set "
                        "MLFLOW_EXPERIMENT_NAME")
    _refuse_deleted(exp, uri)
    return exp.experiment_id


def follow_move(db: Path) -> None:
    """MLflow keeps an experiment's and a run's artifact folder as absolute paths: in a checkout (or an
    offline sweep's folder) moved or copied since its runs started, new artifacts would go to the old
    place (into another checkout's store, or a folder made again where the old one was), and the
    runs' old ones would not be found. The paths into the old `mlartifacts/` beside the store are
    made to name this one's."""
    import contextlib
    import sqlite3

    here = (db.resolve().parent / "mlartifacts").as_uri()
    try:
        with contextlib.closing(sqlite3.connect(db)) as c, c:
            for (old,) in c.execute("SELECT artifact_location FROM experiments").fetchall():
                if old and old.startswith("file:") and old.endswith("/mlartifacts") and old != here:
                    c.execute("UPDATE runs SET artifact_uri = ? || substr(artifact_uri, ?) "
                              "WHERE substr(artifact_uri, 1, ?) = ?", (here, len(old) + 1, len(old) + 1, old + "/"))
                    c.execute("UPDATE experiments SET artifact_location = ? WHERE artifact_location = ?", (here, old))
    except sqlite3.Error:  # no tables yet (a first call killed early), or damaged: opening the store says so
        pass


def _refuse_deleted(exp, uri: str) -> None:
    """MLflow keeps a deleted experiment (in its trash) under its name: no run can be made in it, and
    no new experiment of that name."""
    if exp.lifecycle_stage == "deleted":
        raise UserError(f"MLflow experiment '{exp.name}' at {uri} is deleted (in MLflow's trash): restore it "
                        f"(`mlflow experiments restore --experiment-id {exp.experiment_id}`, with MLFLOW_TRACKING_URI "
                        "set to that store), or record to another with MLFLOW_EXPERIMENT_NAME")


def open_experiment(uri: str, name: str, flag: bool = False):
    """(client, experiment id) of experiment `name` in the store at `uri` (named by --tracking-uri with
    `flag`), created if missing; a sqlite store keeps its artifacts beside it (`mlartifacts/`), so the
    store's folder is self-contained."""
    import logging

    logging.getLogger("mlflow").setLevel(logging.WARNING)  # not "Creating initial database tables" per stage
    # Its traceback of a database error it then raises anyway (a full disk: the CLI says it in one line).
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)

    refuse_journal(uri, flag)
    with _creation_lock(uri):
        db = Path(uri.removeprefix("sqlite:///").split("?", 1)[0]) if uri.startswith("sqlite:///") else None
        if db is not None and db.is_file():
            follow_move(db)
        try:
            from mlflow import MlflowClient

            client = MlflowClient(tracking_uri=uri)
            exp = client.get_experiment_by_name(name)
        except Exception as e:  # a store that cannot be opened fails in many ways (MLflow's imports too)
            raise UserError(store_error(uri, e, f"check {given_by(flag)} or remove a corrupt mlflow.db")) from None
        if exp is None:
            artifacts = None
            if db is not None:
                folder = db.resolve().parent / "mlartifacts"
                folder.mkdir(parents=True, exist_ok=True)  # there from the start: `pbr import` looks for it
                artifacts = folder.as_uri()
            try:
                exp_id = client.create_experiment(name, artifact_location=artifacts, tags={KIND_TAG: KIND})
            except Exception:  # another process (a server's client) created it first
                exp_id = client.get_experiment_by_name(name).experiment_id
        else:
            exp_id = exp.experiment_id
            _refuse_deleted(exp, uri)
            if exp.tags.get(KIND_TAG) != KIND:  # a store made before the tag was set
                client.set_experiment_tag(exp_id, KIND_TAG, KIND)
    return client, exp_id


class _MlflowRecorder:
    """What `stage_run` asks of a store (journal.Recorder answers the same for plain files), from MLflow."""

    def __init__(self, client, exp_id: str, uri: str = "") -> None:
        self.client, self.exp_id, self.uri = client, exp_id, uri

    def running(self) -> list[tuple[str, dict]]:
        found = self.client.search_runs([self.exp_id], filter_string="attributes.status = 'RUNNING'", max_results=1000)
        return [(r.info.run_id, r.data.tags) for r in found]

    def latest_ended(self, tag: str, value: str, where: Callable[[dict, str], bool] = lambda tags, status: True
                     ) -> tuple[str, dict, str] | None:
        """The newest run tagged `tag` = `value` that no process is running (finished, killed or
        failed) and `where(tags, status)` accepts: (run id, tags, status)."""
        found = self.client.search_runs([self.exp_id], filter_string=f"tags.`{tag}` = '{value}'",
                                        order_by=["attributes.start_time DESC"], max_results=100)
        from stages.runtime.journal import ENDED

        return next(((r.info.run_id, r.data.tags, r.info.status) for r in found
                     if r.info.status in ENDED and where(r.data.tags, r.info.status)), None)

    def create(self, tags: dict[str, str]) -> str:
        return self.client.create_run(self.exp_id, tags=tags).info.run_id

    def set_status(self, run_id: str, status: str) -> None:
        if status == "RUNNING":
            self.client.update_run(run_id, status="RUNNING")
        else:
            self.client.set_terminated(run_id, status)

    def kill_if_running(self, run_id: str, pid: str) -> bool:
        run = self.client.get_run(run_id)
        # Its stage finished since the scan, or the next stage joined it (another pid): it lives.
        if run.info.status != "RUNNING" or run.data.tags.get("pbr.pid") != pid:
            return False
        self.client.set_terminated(run_id, "KILLED")
        return True

    def log(self, run_id: str, metrics=(), params: dict | None = None, tags: dict | None = None) -> None:
        from mlflow.entities import Metric, Param, RunTag

        batch = [Metric(k, float(v), ts, step) for k, v, ts, step in metrics]
        if params:
            items = [Param(k, str(v)) for k, v in params.items()]
            for i in range(0, len(items), 100):  # MLflow's limit on a batch's params
                self.client.log_batch(run_id, params=items[i:i + 100])
        chunks = [batch[i:i + 500] for i in range(0, len(batch), 500)] or [[]]  # and 1000 on its metrics
        for i, chunk in enumerate(chunks):
            # The tags with the last metrics, in one call (one request to a server; MLflow's sqlite
            # store commits them a moment apart): a tag saying what is logged (train's logged tasks)
            # and what it says are not left apart by a kill between two calls.
            last = tags if i == len(chunks) - 1 and tags else {}
            if chunk or last:
                self.client.log_batch(run_id, metrics=chunk, tags=[RunTag(k, str(v)) for k, v in last.items()])

    def log_artifact(self, run_id: str, path: Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(run_id, str(path), artifact_path)

    def params(self, run_id: str) -> dict[str, str]:
        return dict(self.client.get_run(run_id).data.params)


def recorder():
    """The store a stage records to, behind the small interface `stage_run` uses: plain files for a
    `journal:` URI (stages/runtime/journal.py, no MLflow needed), else MLflow."""
    from stages.runtime import journal

    uri = recording_uri()
    if uri.startswith(journal.SCHEME):
        # A relative folder is the repository's, as the default store is (queue workers run in copies).
        return journal.Recorder(from_repo(journal.folder_of(uri)), experiment_name())
    return _MlflowRecorder(*open_experiment(uri, experiment_name()), uri)


def init_store() -> str:
    """Create the store and the experiment now (before parallel workers start); returns the URI."""
    recorder()
    return recording_uri()


# A stage recording to MLflow sets `pbr.heartbeat` (its clock, s) every HEARTBEAT_S while its run is
# RUNNING: a run of another machine (a pod, a node that crashed, a SLURM job killed outright) whose
# beat is older than STALE_S has no process behind it, though no stage there is left to say so.
HEARTBEAT_S = 120.0
STALE_S = 20 * 60.0


def _dead(tags: dict, host: str, now: float, heartbeats: bool) -> bool:
    pid = tags.get("pbr.pid")
    if not pid or not pid.isdigit():
        return False
    if tags.get("pbr.host") == host:
        return not runs_still(int(pid), tags.get("pbr.pid_start", ""))
    beat = tags.get("pbr.heartbeat", "")
    return heartbeats and beat.isdigit() and now - int(beat) > STALE_S


def mark_killed(rec, heartbeats: bool = True) -> list[str]:
    """Runs left RUNNING by a process that no longer exists -> KILLED: this host's by their pid, any
    host's by a heartbeat gone stale (`heartbeats`: a store its stages record to, not a copy of one,
    whose beats stopped when it was copied)."""
    host, now = socket.gethostname(), time.time()
    killed = []
    for run_id, tags in rec.running():
        if _dead(tags, host, now, heartbeats) and rec.kill_if_running(run_id, tags["pbr.pid"]):
            killed.append(run_id)
    return killed


@contextlib.contextmanager
def heartbeat(rec, run: StageRun) -> Iterator[None]:
    """`pbr.heartbeat` on the stage's run (the one it records to now: training that starts over moves
    to a new one) every HEARTBEAT_S, in a daemon thread, while the stage runs. MLflow stores only:
    the journal's tag file is rewritten whole, and a second writer would lose the stage's tags."""
    if not isinstance(rec, _MlflowRecorder):
        yield
        return
    stop = threading.Event()

    def beat() -> None:
        while True:
            with contextlib.suppress(Exception):  # a server away for a moment: the next beat says it
                rec.log(run.run_id, tags={"pbr.heartbeat": str(int(time.time()))})
            if stop.wait(HEARTBEAT_S):
                return

    thread = threading.Thread(target=beat, name="pbr-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


def close_dead_runs(uri: str, exp_id: str) -> None:
    """mark_killed for `pbr report` and `pbr ui`: a stage does it as it starts, but a pipeline that DVC
    restores from its cache starts none, which left a killed stage's run RUNNING. Best effort: a store
    that refuses the write (a read-only account) is left as it is."""
    try:
        from mlflow import MlflowClient

        mark_killed(_MlflowRecorder(MlflowClient(tracking_uri=uri), exp_id, uri))
    except Exception:  # noqa: BLE001 (reading goes on whatever the write does)
        pass


class StageRun:
    """The pipeline execution's run, as seen by one stage; `joined`, the tags it had when this stage
    joined it (empty for a run the stage made)."""

    def __init__(self, rec, run_id: str, joined: dict | None = None, was: str = "",
                 fresh: Callable[[], str] | None = None) -> None:
        self.rec, self.run_id, self.joined = rec, run_id, dict(joined or {})
        self._was, self._fresh = was, fresh

    def start_over(self) -> None:
        """Leave the run this stage joined as it was (its earlier status) and go on in a new one: what
        the stage will log is not the joined try's to continue (training started over)."""
        if self.joined and self._fresh is not None:
            self.rec.set_status(self.run_id, self._was)
            self.run_id, self.joined = self._fresh(), {}

    def log_metrics(self, metrics: dict[str, float], step: int = 0) -> None:
        now = int(time.time() * 1000)
        self.rec.log(self.run_id, metrics=[(k, float(v), now, step) for k, v in metrics.items() if v is not None])

    def log_series(self, rows: list[tuple[int, dict[str, float]]], tags: dict[str, Any] | None = None) -> None:
        """Metrics at several steps, and `tags` recorded with them (never one without the other)."""
        now = int(time.time() * 1000)
        self.rec.log(self.run_id, metrics=[(k, float(v), now, step) for step, d in rows for k, v in d.items()
                                           if v is not None], tags={k: str(v) for k, v in (tags or {}).items()})

    def log_once(self, marker: str, rows: list[tuple[int, dict[str, float]]]) -> None:
        """A stage's metrics (as log_series) with the tag `marker` = their digest, unless the run this
        stage joined holds that tag: a try killed after logging them (before the stage's end) had
        them in the run, and the next try logged each point again. Points of other values (another
        training) are logged: the skip never hides them."""
        points = sorted((step, k, float(v)) for step, d in rows for k, v in d.items() if v is not None)
        digest = hashlib.sha256(repr(points).encode()).hexdigest()[:16]
        if self.joined.get(marker) != digest:
            self.log_series(rows, tags={marker: digest})

    def set_tags(self, tags: dict[str, Any]) -> None:
        self.rec.log(self.run_id, tags={k: str(v) for k, v in tags.items()})

    def log_new_params(self, params: dict[str, Any]) -> None:
        """The `params` the run does not hold yet: MLflow refuses to change a param's value, and a
        joined run (a killed try's, one an earlier stage recorded them in) may hold them already."""
        held = self.rec.params(self.run_id)
        new = {k: v for k, v in params.items() if k not in held}
        if new:
            self.rec.log(self.run_id, params=new)

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        if Path(path).exists():
            self.rec.log_artifact(self.run_id, Path(path), artifact_path)


STAGES = ("prepare", "train", "score", "evaluate")  # dvc.yaml's order


def run_name(flat_params: dict[str, Any], exp_name: str) -> str:
    """A run's name in MLflow's list: its method, dataset, buffer size and seed, then DVC's experiment
    name in parentheses (`dvc exp run` without -n names it like peppy-dado, which says none of them).
    A name that holds the method and the seed already (pbr sweep's c10-pbr-b200-ord-ir0.01-s0) alone.
    No buffer size for a method that keeps no buffer (sgd-cifar10-s0: params.yaml's 200 is not its)."""
    method, seed, buffer = (flat_params.get(k) for k in ("method.name", "seed", "method.buffer_size"))
    if exp_name and {str(method), f"s{seed}"} <= set(exp_name.split("-")):
        return exp_name
    from pbr.methods import METHODS

    if method in METHODS and not METHODS[method].uses_buffer:
        buffer = None
    parts = [str(v) for v in (method, flat_params.get("data.dataset")) if v is not None]
    parts += ([f"b{buffer}"] if buffer is not None else []) + ([f"s{seed}"] if seed is not None else [])
    name = "-".join(parts) or "pbr"
    return f"{name} ({exp_name})" if exp_name else name


def source_tags(git: dict[str, str]) -> dict[str, str]:
    """MLflow's own tag of the code's commit (git_state's), which its UI shows in the Version column."""
    commit = git.get("git.commit", "unknown")
    return {} if commit == "unknown" else {"mlflow.source.git.commit": commit}


def _done_here_or_later(stage: str, tags: dict) -> bool:
    later = STAGES[STAGES.index(stage):] if stage in STAGES else (stage,)
    return any(tags.get(f"pbr.stage.{s}") == "done" for s in later)


def _trained_on_disk(stage: str, tags: dict) -> bool:
    """Whether the training a run holds (its `pbr.fingerprint`, where it has one) is the one this
    stage reads (artifacts/train/run.json): always for the stages up to train, which train again."""
    if stage in STAGES[:STAGES.index("train") + 1] or "pbr.fingerprint" not in tags:
        return True
    try:
        return json.loads((TRAIN / "run.json").read_text()).get("fingerprint") == tags["pbr.fingerprint"]
    except (OSError, ValueError, AttributeError):
        return False


@contextlib.contextmanager
def stage_run(stage: str, flat_params: dict[str, Any], params_file: Path, tags: dict | None = None
              ) -> Iterator[StageRun]:
    rec = recorder()
    mark_killed(rec)
    git = git_state()
    key = pipeline_key(params_file, git["git.commit"])
    # Whenever the run is RUNNING it names this process, so that a kill at any instant leaves a run the
    # next stage marks KILLED, never one RUNNING for good.
    me = {"pbr.pid": str(os.getpid()), "pbr.pid_start": process_start(os.getpid()), "pbr.host": socket.gethostname(),
          "pbr.checkout": str(anchor()), "pbr.workdir": str(Path.cwd().resolve())}
    if isinstance(rec, _MlflowRecorder):  # where the stage beats (heartbeat): not in plain files, whose first
        # beat would go stale while the stage runs; a joined run's last beat is its killed try's until the thread's
        me["pbr.heartbeat"] = str(int(time.time()))
    exp_name = os.environ.get("DVC_EXP_NAME", "")
    # The stages of one execution share its run: a stage joins the latest run of its settings and its
    # execution (DVC's experiment name) that no process runs, unless that has this stage or a later
    # one done: then it is an earlier execution (`dvc exp run -f`, a cached stage skipped there),
    # which keeps its run. A killed or failed one is joined too: `dvc repro` after a kill (or after
    # the cause of a failure is fixed) finishes the same execution, and its run holds every stage's
    # records, the earlier tries' included, rather than a KILLED run with the first stages' and a
    # FINISHED one with the rest. Only a try of this machine and checkout (a teammate's killed run
    # on the team server, of the same commit and params, is theirs).
    def ours(tags: dict, status: str) -> bool:
        same = all(tags.get(k) == me[k] for k in ("pbr.host", "pbr.checkout"))
        return tags.get("dvc.exp_name", "") == exp_name and (status == "FINISHED" or same)

    # `dvc exp run` names each try anew (without -n): the try after one killed while scoring skipped
    # train (DVC had committed it) and started a second run, without train's records. A stage with
    # no run of its name to join takes, under the same rule, the latest run of its settings made in
    # this very folder of this machine: the killed try's. Never a queue worker's (each runs in a copy
    # of its own, so queued runs never join each other), nor, after train, one whose training is not
    # the one on disk (the key holds no code hash: training code edited, not committed, keeps it).
    def here(tags: dict, status: str) -> bool:
        return all(tags.get(k) == me[k] for k in ("pbr.host", "pbr.checkout", "pbr.workdir"))

    stage_tags = {**git, **me, "pbr.stage": stage, "dvc.exp_name": exp_name,
                  "dvc.baseline_rev": os.environ.get("DVC_EXP_BASELINE_REV", ""),
                  **{f"pbr.version.{k}": v for k, v in library_versions().items()},
                  "mlflow.runName": run_name(flat_params, exp_name), **source_tags(git),
                  **(tags or {})}

    def fresh() -> str:
        run_id = rec.create({"pbr.pipeline_key": key, **me})
        rec.log(run_id, params=flat_params, tags={k: str(v) for k, v in stage_tags.items()})
        return run_id

    found = rec.latest_ended("pbr.pipeline_key", key, ours)
    if found is None or _done_here_or_later(stage, found[1]):
        found = rec.latest_ended("pbr.pipeline_key", key, here)
        if found is not None and not _trained_on_disk(stage, found[1]):
            found = None
    if found is not None and not _done_here_or_later(stage, found[1]):
        run_id, joined, was = found
        # A try killed between creating its run and logging its params (fresh) left a run without them.
        rec.log(run_id, tags=me, params=flat_params if "pbr.stage" not in joined else None)
        rec.set_status(run_id, "RUNNING")
        r = StageRun(rec, run_id, joined, was, fresh)
        r.set_tags(stage_tags)
    else:
        r = StageRun(rec, fresh())
    try:
        with heartbeat(rec, r):
            yield r
    except BaseException as e:
        _server_gone(rec, stage, e)
        # Ctrl-C (or an offline sweep stopping its runs): killed, as a dead process's run is marked.
        rec.set_status(r.run_id, "KILLED" if isinstance(e, KeyboardInterrupt) else "FAILED")
        raise
    try:
        # FINISHED first: killed before the tags, the stage's next try joins the run again (not "done").
        rec.set_status(r.run_id, "FINISHED")
        r.set_tags({f"pbr.stage.{stage}": "done", "pbr.pid": ""})
    except Exception as e:
        _server_gone(rec, stage, e)
        raise


def _server_gone(rec, stage: str, e: BaseException) -> None:
    """A one-line error, instead of MLflow's traceback and a second round of its retries, when the
    server the stage records to stopped answering after the stage began. The stage's finished work
    is on disk; its run stays RUNNING there until a stage that reaches the server marks it KILLED."""
    uri = getattr(rec, "uri", "")
    if isinstance(e, (KeyboardInterrupt, UserError)) or not _remote(uri):
        return
    why = unreachable(uri, again=True)
    if why is not None:
        raise UserError(f"MLflow server {uri} stopped answering during the {stage} stage ({why}); what the stage "
                        "finished is kept: run it again, and while the server is down it records to "
                        f"{OFFLINE_DIR}/ (docs/offline.md)") from None
