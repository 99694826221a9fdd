"""`pbr import SOURCE`: copy the runs of another MLflow store into the project's store.

For runs recorded where no tracking server was reachable (`pbr sweep --offline DIR`, or stages
that fell back to `mlflow-offline/`): SOURCE is that folder copied back (mlflow.db and
mlartifacts/, or journal/: runs recorded to plain files where MLflow was not installed), a .db
file, or any MLflow tracking URI. A run is copied whole: params, tags, every
metric's full history, status, start and end times, name and artifacts, so `pbr report` counts
it as it counts a run recorded here (its FINISHED status and pbr.complete tag come along).

Each copy carries its origin, the source run's id, in the tag pbr.imported_from: importing the
same SOURCE again copies nothing new, and a source run that changed since (a later stage finished
on it) replaces its copy. A copy is tagged pbr.importing until it is whole; the next import
deletes one that an interrupted import left, and copies its run again. Runs still RUNNING in the
source are skipped: they are unfinished there (or their process died there), a copy would stay
RUNNING here for good, and `pbr report` would not count it anyway; once the run has finished, or
the next stage on that machine has marked it KILLED, an import picks it up.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from pbr.errors import UserError
from stages.experiments.offline import JOURNAL_DIR
from stages.runtime import journal, tracking
from stages.runtime.paths import from_repo

ORIGIN_TAG = "pbr.imported_from"      # the source run's id (its own origin when it was imported too)
VERSION_TAG = "pbr.imported_version"  # the source run's status and end time when it was copied
SOURCE_TAG = "pbr.imported_source"    # where it was imported from, for people
PENDING_TAG = "pbr.importing"         # on a copy until it is whole
BY_TAG = "pbr.importing_by"           # "host pid start-time" of the import making that copy
BARE_TAG = "pbr.imported_without_artifacts"  # on a copy made without them: a later import with them replaces it
ABANDONED_S = 3600  # a part copy older than this, made on another machine, is an import cut short
UNFINISHED = ("RUNNING", "SCHEDULED")
METRICS_PER_BATCH, PARAMS_TAGS_PER_BATCH = 1000, 100  # MLflow's log_batch limits
SQLITE_HEADER = b"SQLite format 3\x00"
FIX = ("give the folder copied back from the offline machine (it holds mlflow.db and mlartifacts/, or journal/), "
       "a .db file, or an MLflow tracking URI")


@dataclass(frozen=True)
class Source:
    uri: str
    folder: Path | None  # where copied artifact folders are looked for, for a local store
    label: str


@dataclass
class Outcome:
    target: str
    imported: int = 0
    replaced: int = 0
    present: int = 0
    skipped: int = 0

    def summary(self) -> str:
        runs = "run" if self.imported == 1 else "runs"
        text = (f"imported {self.imported} {runs} ({self.present} already present, {self.skipped} skipped) "
                f"into {self.target}")
        if self.replaced:
            text += f"; {self.replaced} of them replaced an older copy"
        return text + ("; nothing new" if self.imported == 0 else "")


def _file_store(folder: Path) -> bool:
    return (folder / "0" / "meta.yaml").is_file() or any(folder.glob("*/meta.yaml"))


def _allow_file_store() -> None:
    import os

    # MLflow 3 refuses its file store (./mlruns) unless told; reading an old one to copy it is fine.
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")


def _sqlite(db: Path, source: str) -> Source:
    try:
        with open(db, "rb") as f:
            head = f.read(len(SQLITE_HEADER))
    except OSError as e:
        raise UserError(f"SOURCE {source}: {db} cannot be read ({e.strerror}); check its permissions") from None
    if head != SQLITE_HEADER:
        raise UserError(f"SOURCE {source}: {db} is not an sqlite MLflow store; {FIX}")
    db = db.resolve()
    return Source(f"sqlite:///{db}", db.parent, source)


def _journal(folder: Path, source: str) -> Source:
    folder = folder.resolve()
    return Source(journal.uri(folder), folder, source)


def resolve_source(source: str) -> Source:
    """The store SOURCE names: a folder holding mlflow.db (or an old ./mlruns file store) or runs
    recorded to plain files (journal/, where MLflow was not installed), a .db file, or a tracking
    URI. A one-line error when there is none."""
    if source.startswith(journal.SCHEME):
        folder = from_repo(journal.folder_of(source))  # a relative one is the repository's, as the stages read it
        if not journal.is_journal(folder):
            raise UserError(f"SOURCE {source}: no runs recorded to plain files in {folder}; {FIX}")
        return _journal(folder, source)
    if "://" in source:
        if source.startswith("sqlite:///"):
            db = Path(source[len("sqlite:///"):].split("?", 1)[0])
            if not db.is_file():
                raise UserError(f"SOURCE {source}: no such file {db}; {FIX}")
            return _sqlite(db, source)
        if source.startswith("file:"):
            _allow_file_store()
            return Source(source, Path(urllib.parse.urlsplit(source).path), source)
        return Source(source, None, source)
    path = Path(source).expanduser()
    if not path.exists():
        raise UserError(f"SOURCE {source}: no such file or folder; {FIX}")
    if path.is_file():
        return _sqlite(path, source)
    if (path / "mlflow.db").is_file():
        return _sqlite(path / "mlflow.db", source)
    for folder in (path / JOURNAL_DIR, path):
        if journal.is_journal(folder):
            return _journal(folder, source)
    if (path / JOURNAL_DIR).is_dir():
        raise UserError(f"SOURCE {source}: its {JOURNAL_DIR}/ holds no run yet (an offline sweep records a run there "
                        "when its first stage starts); import again once runs have started")
    if _file_store(path):
        _allow_file_store()
        return Source(path.resolve().as_uri(), path.resolve(), source)
    raise UserError(f"SOURCE {source}: the folder holds no mlflow.db; {FIX}")


def _store_key(uri: str) -> str:
    if uri.startswith(journal.SCHEME):
        return str(journal.folder_of(uri).resolve())
    if uri.startswith("sqlite:///"):
        return str(Path(uri[len("sqlite:///"):].split("?", 1)[0]).resolve())
    return uri.rstrip("/")


def _local_path(uri: str) -> Path | None:
    """The path of a local artifact location, None for a remote one (s3:, mlflow-artifacts:, ...)."""
    u = urllib.parse.urlsplit(uri)
    if u.scheme == "file":
        return Path(urllib.parse.unquote(u.path))
    return Path(uri) if u.scheme == "" else None


def _moved(path: Path, folder: Path | None, must: str) -> Path | None:
    """`path` if it exists, else where it is now inside `folder` (the store's folder was copied from
    another machine, so its absolute artifact paths point there): the longest tail of `path` that
    exists under `folder` and contains the component `must`."""
    if path.exists():
        return path
    if folder is None:
        return None
    parts = path.parts[1:]
    for i in range(len(parts)):
        tail = parts[i:]
        if must in tail and (folder.joinpath(*tail)).is_dir():
            return folder.joinpath(*tail)
    return None


def _open_source(src: Source, experiment: str):
    import logging

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    try:
        from mlflow import MlflowClient

        client = journal.Reader(src.folder) if src.uri.startswith(journal.SCHEME) else MlflowClient(tracking_uri=src.uri)
        exp = client.get_experiment_by_name(experiment)
        names = [] if exp is not None else [e.name for e in client.search_experiments()]
    except Exception as e:  # a store that cannot be opened fails in many ways
        said = tracking.store_error(
            src.uri, e, "check SOURCE (a store made by an older MLflow: `mlflow db upgrade` a copy of it)")
        raise UserError(said if isinstance(e, ImportError) else "SOURCE: " + said) from None  # not SOURCE's fault
    if exp is None:
        raise UserError(f"SOURCE {src.label} has no experiment '{experiment}' (it has: {', '.join(names) or 'none'}); "
                        "pass --experiment NAME")
    return client, exp


def _close_dead_runs(src: Source, client, exp) -> None:
    """A local SOURCE's runs left RUNNING by a dead process of this machine -> KILLED, as a stage
    recording there would mark them: the server back, no stage records to the offline store again,
    and its killed try stayed "still RUNNING" to every import. Best effort: a read-only copy stays."""
    if not (src.uri.startswith("sqlite:///") or src.uri.startswith(journal.SCHEME)):
        return  # a server: its stages mark their own
    try:
        rec = (journal.Recorder(src.folder, exp.name) if src.uri.startswith(journal.SCHEME)
               else tracking._MlflowRecorder(client, exp.experiment_id, src.uri))
        tracking.mark_killed(rec, heartbeats=False)  # a copied folder's beats stopped when it was copied
    except Exception:  # noqa: BLE001 (reading goes on whatever the write does)
        pass


def _search(client, exp_id: str, filter_string: str = "", order_by: list[str] | None = None) -> list:
    found, token = [], None
    while True:
        page = client.search_runs([exp_id], filter_string=filter_string, max_results=1000, order_by=order_by,
                                  page_token=token)
        found.extend(page)
        token = page.token
        if not token:
            return found


def _cut_short(tags: dict) -> bool:
    """Whether a part copy was left by an import that stopped, not one another import is making now
    (two teammates importing into one server at once): its importer is dead on this machine, or it
    is over an hour old (on this machine too: a pid is reused); a copy from before imports named
    themselves counts as left."""
    try:
        host, pid, since = tags[BY_TAG].rsplit(" ", 2)
        pid, since = int(pid), float(since)
    except (KeyError, ValueError):
        return True
    # Over an hour old is left on this machine too: its importer's pid may be another process's now.
    if host == socket.gethostname() and pid != os.getpid() and not tracking.pid_alive(pid):
        return True
    return time.time() - since > ABANDONED_S


@dataclass(frozen=True)
class Copy:
    run_id: str
    version: str
    bare: bool  # made without the source's artifacts
    carried_on: bool = False  # a stage here went on in it since it was copied (its status or end moved)


def _copies(dst, exp_id: str, log: Callable[[str], None]) -> dict[str, Copy]:
    """Origin -> its whole copy in the target; deletes those an interrupted import left, and the
    extra copies two imports at once made of one run."""
    for run in _search(dst, exp_id, f"tags.`{PENDING_TAG}` LIKE '%'"):
        if ORIGIN_TAG not in run.data.tags and _cut_short(run.data.tags):
            dst.delete_run(run.info.run_id)
            log(f"deleted {run.info.run_name}: an import cut short left it part-copied (it is copied again)")
    found: dict[str, list] = {}
    for r in _search(dst, exp_id, f"tags.`{ORIGIN_TAG}` LIKE '%'"):
        found.setdefault(r.data.tags[ORIGIN_TAG], []).append(r)
    return {origin: _one_copy(dst, runs, log) for origin, runs in found.items()}


def _one_copy(dst, runs: list, log: Callable[[str], None]) -> Copy:
    """The copy of one origin that stays (the latest version, then the lowest run id: what every
    import picks alike); the others are deleted."""
    runs = sorted(runs, key=lambda r: (-_end(r.data.tags.get(VERSION_TAG, "")), r.info.run_id))
    for extra in runs[1:]:
        dst.delete_run(extra.info.run_id)
        log(f"deleted a second copy of {extra.info.run_name} (two imports at once copied it)")
    keep = runs[0]
    version = keep.data.tags.get(VERSION_TAG, "")
    return Copy(keep.info.run_id, version, keep.data.tags.get(BARE_TAG) == "true",
                bool(version) and version != f"{keep.info.status}:{keep.info.end_time}")


def _copies_of(dst, exp_id: str, origin: str, log: Callable[[str], None]) -> tuple[Copy | None, bool]:
    """The whole copy of `origin` the target holds now, and whether another import is making one."""
    making = any(not _cut_short(r.data.tags) for r in _search(dst, exp_id, f"tags.`{PENDING_TAG}` = '{origin}'"))
    whole = _search(dst, exp_id, f"tags.`{ORIGIN_TAG}` = '{origin}'")
    return (_one_copy(dst, whole, log) if whole else None), making


def _original_here(dst, run_id: str) -> bool:
    """Whether the target holds the run itself (it went out to SOURCE by an earlier import)."""
    try:
        return dst.get_run(run_id).info.lifecycle_stage == "active"
    except Exception:  # MLflow raises for a run id it does not know
        return False


def _chunks(items: list, n: int):
    for i in range(0, len(items), n):
        yield items[i:i + n]


def _artifacts(src_client, src: Source, run, tmp: Path) -> Path | None:
    """A local folder holding the run's artifacts, None when it has none."""
    path = _local_path(run.info.artifact_uri)
    if path is not None:
        return _moved(path, src.folder, run.info.run_id)
    if not src_client.list_artifacts(run.info.run_id):
        return None
    tmp.mkdir(parents=True, exist_ok=True)
    return Path(src_client.download_artifacts(run.info.run_id, "", dst_path=str(tmp)))


def _copy_run(src_client, dst, exp_id: str, run, origin: str, version: str, label: str,
              artifacts: Path | None) -> str:
    info = run.info
    by = f"{socket.gethostname()} {os.getpid()} {time.time():.0f}"
    rid = dst.create_run(exp_id, start_time=info.start_time,
                         tags={PENDING_TAG: origin, BY_TAG: by}, run_name=info.run_name).info.run_id
    try:
        _fill(src_client, dst, rid, run, origin, version, label, artifacts)
    except Exception:
        # Not left RUNNING and half-copied until the next import finds it (an MLflow error on one
        # value, a server that went away): the part copy goes at once.
        with contextlib.suppress(Exception):
            dst.delete_run(rid)
        raise
    return rid


def _fill(src_client, dst, rid: str, run, origin: str, version: str, label: str, artifacts: Path | None) -> None:
    from mlflow.entities import Metric, Param, RunTag

    info, data = run.info, run.data
    for chunk in _chunks([Param(k, v) for k, v in data.params.items()], PARAMS_TAGS_PER_BATCH):
        dst.log_batch(rid, params=chunk)
    history = [Metric(m.key, m.value, m.timestamp, m.step)
               for key in data.metrics for m in src_client.get_metric_history(info.run_id, key)]
    for chunk in _chunks(history, METRICS_PER_BATCH):
        dst.log_batch(rid, metrics=chunk)
    if artifacts is not None:
        dst.log_artifacts(rid, str(artifacts))
    dst.set_terminated(rid, info.status, end_time=info.end_time)
    tags = [RunTag(k, v) for k, v in data.tags.items()
            if k not in (ORIGIN_TAG, VERSION_TAG, SOURCE_TAG, PENDING_TAG, BY_TAG)]
    for chunk in _chunks(tags, PARAMS_TAGS_PER_BATCH):
        dst.log_batch(rid, tags=chunk)
    # The origin last: a copy that has it is whole.
    bare = [RunTag(BARE_TAG, "true")] if artifacts is None else []
    dst.log_batch(rid, tags=[RunTag(VERSION_TAG, version), RunTag(SOURCE_TAG, label), *bare, RunTag(ORIGIN_TAG, origin)])
    dst.delete_tag(rid, PENDING_TAG)
    dst.delete_tag(rid, BY_TAG)


def _end(version: str) -> int:
    """The end time in a copy's version ("STATUS:end_time"); -1 where there is none."""
    try:
        return int(version.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return -1


def import_runs(source: str, target_uri: str, experiment: str, with_artifacts: bool = True,
                log: Callable[[str], None] = print, flag: bool = False) -> Outcome:
    """Copy the runs of experiment `experiment` in SOURCE into the same experiment at `target_uri`
    (named by --tracking-uri with `flag`)."""
    import os

    # Not MLflow's two "View run ... at" lines per run copied to a server, nor its progress bar for
    # each run's artifacts downloaded from one: one line a run is pbr's own.
    quiet = {"MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true", "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}
    before = {k: os.environ.get(k) for k in quiet}
    os.environ.update(quiet)
    try:
        return _import(source, target_uri, experiment, with_artifacts, log, flag)
    finally:
        for k, v in before.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v


def _import(source: str, target_uri: str, experiment: str, with_artifacts: bool,
            log: Callable[[str], None], flag: bool = False) -> Outcome:
    src = resolve_source(source)
    if _store_key(src.uri) == _store_key(target_uri):
        fix = ("give --tracking-uri another store" if flag else
               "pass --tracking-uri, or unset PBR_OFFLINE / MLFLOW_TRACKING_URI=offline")
        raise UserError(f"SOURCE {source} is the store it would import into ({target_uri}): {fix}")
    for role, uri in (("SOURCE", src.uri), ("the target store", target_uri)):
        why = tracking.unreachable(uri)
        if why is not None:
            raise UserError(f"{role} {uri} is unreachable ({why}): start the server, or check the address")
    src_client, exp = _open_source(src, experiment)
    _close_dead_runs(src, src_client, exp)
    runs = _search(src_client, exp.experiment_id, order_by=["attributes.start_time ASC"])
    root = _local_path(exp.artifact_location)
    if with_artifacts and runs and root is not None and _moved(root, src.folder, root.name) is None:
        raise UserError(f"SOURCE {source}: its artifacts folder {root} is not here (nor under {src.folder}): copy "
                        "mlartifacts/ along with mlflow.db and import again, or pass --no-artifacts")
    dst, exp_id = tracking.open_experiment(target_uri, experiment, flag)
    copies = _copies(dst, exp_id, log)
    out = Outcome(target_uri)
    for folder, why in getattr(src_client, "damaged", []):  # a journal's runs whose files do not read whole
        log(f"skipped {folder.name}: {why} (copied in part?); copy {folder} again and import again")
        out.skipped += 1
    with tempfile.TemporaryDirectory(prefix="pbr-import-") as tmp:
        for run in runs:
            info = run.info
            name = info.run_name or info.run_id
            if info.status in UNFINISHED:
                log(f"skipped {name} ({info.run_id}): still {info.status} in the source; import again once it "
                    "has finished there")
                out.skipped += 1
                continue
            origin = run.data.tags.get(ORIGIN_TAG) or info.run_id
            version = f"{info.status}:{info.end_time}"
            old = copies.get(origin)
            if old is None and _original_here(dst, origin):
                out.present += 1
                continue
            files = None
            if old is not None and _end(version) <= _end(old.version):
                # A copy the target holds stays unless this one is later (a later stage finished on
                # the run: an older copy, arriving through a store imported before that stage,
                # never replaces it), or it was made without artifacts this source now has.
                if not (with_artifacts and old.bare and _end(version) == _end(old.version)):
                    out.present += 1
                    continue
                files = _artifacts(src_client, src, run, Path(tmp) / info.run_id)
                if files is None:
                    out.present += 1
                    continue
            # Another import into this store may have copied it since `copies` was read.
            now, making = _copies_of(dst, exp_id, origin, log)
            if making or (now is not None and now != old):
                out.present += 1
                continue
            if old is not None and old.carried_on:
                # A later stage here joined the copy (the server back mid-pipeline) and the source went
                # on too: replacing the copy would delete what was recorded here.
                log(f"kept {name} ({info.run_id}): it went on here since it was imported, and changed in the source "
                    "too; the source's later records are not copied (import it into another experiment to see them)")
                out.skipped += 1
                continue
            if with_artifacts and files is None:
                files = _artifacts(src_client, src, run, Path(tmp) / info.run_id)
            if old is not None:
                dst.delete_run(old.run_id)
                out.replaced += 1
                log(f"replacing {name}: it changed in the source since it was imported" if not old.bare or
                    _end(version) != _end(old.version) else f"replacing {name}: its artifacts are here now")
            _copy_run(src_client, dst, exp_id, run, origin, version, src.label, files)
            if files is not None and Path(tmp) in files.parents:
                shutil.rmtree(files, ignore_errors=True)
            out.imported += 1
            bare = (" without artifacts: SOURCE has none of it (if it had some, copy them and import again: the copy "
                    "is then replaced)" if with_artifacts and files is None and info.status == "FINISHED" else "")
            log(f"imported {name} ({info.status.lower()}){bare}")
            # Two imports at once may both have copied it: one copy stays, the same one for both.
            _copies_of(dst, exp_id, origin, log)
    return out
