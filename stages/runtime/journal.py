"""Runs recorded to plain files, for a machine without MLflow (a GPU box, an air-gapped node).

The stages record through `tracking.stage_run` as always; with `MLFLOW_TRACKING_URI=journal:DIR`
(what `pbr sweep --offline` sets where MLflow is not installed) the records go to DIR, one folder
per run, in formats any tool reads:

    DIR/<experiment>/<run id>/run.json       status, start and end times (ms), run name
    DIR/<experiment>/<run id>/params.json    {"key": "value"}
    DIR/<experiment>/<run id>/tags.json      {"key": "value"}
    DIR/<experiment>/<run id>/metrics.jsonl  one {"key", "value", "timestamp", "step"} a line
    DIR/<experiment>/<run id>/artifacts/     the logged files, under their artifact paths

`pbr import` reads such a folder (`Reader`, with MLflow's names for what it reads) and copies its
runs into an MLflow store like any other source. Nothing here imports MLflow.

Each run is written by one stage process at a time; the JSON files are replaced whole (written
beside, then renamed), so a kill leaves the previous version, and a kill mid-line leaves a last
metrics line that the reader skips.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterable, Iterator

from pbr.errors import UserError

ENDED = ("FINISHED", "KILLED", "FAILED")  # a run's statuses once no process runs it

SCHEME = "journal:"
RUN, PARAMS, TAGS, METRICS, ARTIFACTS = "run.json", "params.json", "tags.json", "metrics.jsonl", "artifacts"


def uri(folder: Path) -> str:
    return f"{SCHEME}{Path(folder).resolve()}"


def folder_of(journal_uri: str) -> Path:
    return Path(journal_uri[len(SCHEME):])


def _now_ms() -> int:
    return int(time.time() * 1000)


def _read(path: Path, default: Any = None) -> Any:
    """The JSON file at `path`; `default` where there is none or it cannot be read whole (a stray file
    copied in, a disk that lost the last write): one bad entry must not stop every later stage."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return default


def _run_folders(home: Path) -> Iterator[tuple[Path, dict]]:
    """(folder, run.json) of each run under an experiment's folder, skipping what is not one."""
    for d in home.iterdir():
        info = _read(d / RUN) if d.is_dir() else None
        if isinstance(info, dict) and info.get("run_id") == d.name and "status" in info:
            yield d, info


def _ends_mid_line(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() == 0:
                return False
            f.seek(-1, os.SEEK_END)
            return f.read(1) != b"\n"
    except FileNotFoundError:
        return False


def _replace(path: Path, value: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value, indent=1, sort_keys=True))
    tmp.replace(path)


class Recorder:
    """The stages' side: the few things `tracking.stage_run` asks of a store."""

    def __init__(self, folder: Path, experiment: str) -> None:
        if not experiment or "/" in experiment or experiment.startswith("."):
            raise UserError(f"MLFLOW_EXPERIMENT_NAME {experiment!r}: with plain-file records give a name without '/' "
                            "that does not start with '.'")
        self.home = Path(folder) / experiment
        self.home.mkdir(parents=True, exist_ok=True)

    def _runs(self) -> list[tuple[str, dict, dict]]:
        return [(d.name, info, _read(d / TAGS, {})) for d, info in _run_folders(self.home)]

    def running(self) -> list[tuple[str, dict]]:
        return [(rid, tags) for rid, info, tags in self._runs() if info["status"] == "RUNNING"]

    def latest_ended(self, tag: str, value: str, where: Callable[[dict, str], bool] = lambda tags, status: True
                     ) -> tuple[str, dict, str] | None:
        """As MLflow's recorder (tracking._MlflowRecorder.latest_ended)."""
        found = [(info["start_time"], rid, tags, info["status"]) for rid, info, tags in self._runs()
                 if info["status"] in ENDED and tags.get(tag) == value and where(tags, info["status"])]
        return max(found, key=lambda f: f[0])[1:] if found else None

    def create(self, tags: dict[str, str]) -> str:
        rid = uuid.uuid4().hex
        d = self.home / rid
        (d / ARTIFACTS).mkdir(parents=True)
        _replace(d / TAGS, {k: str(v) for k, v in tags.items()})
        _replace(d / PARAMS, {})
        _replace(d / RUN, {"run_id": rid, "status": "RUNNING", "start_time": _now_ms(), "end_time": None})
        return rid

    def set_status(self, rid: str, status: str) -> None:
        d = self.home / rid
        info = _read(d / RUN)
        info.update(status=status, end_time=None if status == "RUNNING" else _now_ms())
        _replace(d / RUN, info)

    def kill_if_running(self, rid: str, pid: str) -> bool:
        """KILLED if the run is still RUNNING now under the process `pid` the caller has seen gone (read
        again: its stage may have finished since the scan, or the next stage joined it)."""
        info = _read(self.home / rid / RUN)
        if info is None or info["status"] != "RUNNING" or (_read(self.home / rid / TAGS) or {}).get("pbr.pid") != pid:
            return False
        self.set_status(rid, "KILLED")
        return True

    def log(self, rid: str, metrics: Iterable[tuple[str, float, int, int]] = (), params: dict | None = None,
            tags: dict | None = None) -> None:
        d = self.home / rid
        if params:
            _replace(d / PARAMS, {**_read(d / PARAMS, {}), **{k: str(v) for k, v in params.items()}})
        lines = "".join(json.dumps({"key": k, "value": v, "timestamp": ts, "step": step}) + "\n"
                        for k, v, ts, step in metrics)
        if lines:
            # A try killed mid-line left the file without its last newline: this try's points start
            # on a line of their own, not glued to the torn one.
            if _ends_mid_line(d / METRICS):
                lines = "\n" + lines
            with open(d / METRICS, "a") as f:
                f.write(lines)
        if tags:  # after the metrics: a tag saying what is logged (train's logged tasks) never runs ahead of it
            _replace(d / TAGS, {**_read(d / TAGS, {}), **{k: str(v) for k, v in tags.items()}})

    def params(self, rid: str) -> dict[str, str]:
        return _read(self.home / rid / PARAMS, {}) or {}

    def log_artifact(self, rid: str, path: Path, artifact_path: str | None = None) -> None:
        dest = self.home / rid / ARTIFACTS / (artifact_path or "")
        dest.mkdir(parents=True, exist_ok=True)
        tmp = self.home / rid / f".artifact.{os.getpid()}.tmp"  # outside artifacts/: a kill leaves nothing there
        shutil.copyfile(path, tmp)
        tmp.replace(dest / Path(path).name)


def is_journal(folder: Path) -> bool:
    """Whether `folder` holds recorded runs as this module writes them."""
    return folder.is_dir() and any(next(_run_folders(e), None) for e in folder.iterdir() if e.is_dir())


class _Page(list):
    token = None


class Damaged(Exception):
    """A run folder whose files do not read whole (a copy that lost part of them)."""


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class Reader:
    """`pbr import`'s side: what sync reads of an MLflow source (get_experiment_by_name, search_runs,
    get_metric_history, artifacts), from a journal folder, as plain objects with MLflow's field names."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.damaged: list[tuple[Path, str]] = []

    def get_experiment_by_name(self, name: str):
        home = self.folder / name
        if not home.is_dir():
            return None
        return SimpleNamespace(experiment_id=name, name=name, artifact_location=str(home))

    def search_experiments(self) -> list:
        return [SimpleNamespace(name=d.name) for d in sorted(self.folder.iterdir()) if d.is_dir()]

    def _metrics(self, d: Path) -> list[dict]:
        try:
            text = (d / METRICS).read_text()
        except FileNotFoundError:
            return []
        out = []
        for i, line in enumerate(text.splitlines()):
            try:
                m = json.loads(line)
            except json.JSONDecodeError:
                # Torn by a process killed while writing it (the lines are only ever appended): skipped,
                # or, where an older version's writer glued the next try's first point to it, that point.
                start = line.rfind('{"key"')
                try:
                    m = json.loads(line[start:]) if start > 0 else None
                except json.JSONDecodeError:
                    m = None
                if m is None:
                    continue
            if not (isinstance(m, dict) and isinstance(m.get("key"), str) and _number(m.get("value"))
                    and all(isinstance(m.get(k), int) and not isinstance(m.get(k), bool) for k in ("timestamp", "step"))):
                raise Damaged(f"{METRICS} line {i + 1} is not a metric point (key, value, timestamp, step)")
            out.append(m)
        return out

    def _check(self, d: Path, info: dict) -> tuple[dict, dict]:
        """The run's params and tags, each a {name: text} read whole; Damaged where a file is not."""
        if not isinstance(info.get("start_time"), int) or not isinstance(info.get("end_time"), (int, type(None))):
            raise Damaged(f"{RUN} has no start or end time")
        found = []
        for name in (PARAMS, TAGS):
            value = _read(d / name)
            if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
                raise Damaged(f"{name} cannot be read as {{name: text}}")
            found.append(value)
        return found[0], found[1]  # no artifacts/ (an archive of files only drops an empty one): none

    def _damaged_run_json(self, home: Path) -> Iterator[Path]:
        """Folders that hold a run.json this module never leaves (it replaces it whole): a copy
        that lost part of it."""
        for d in sorted(home.iterdir()):
            if d.is_dir() and (d / RUN).is_file() and (d / TAGS).is_file() and not isinstance(_read(d / RUN), dict):
                yield d

    def search_runs(self, experiment_ids: list[str], order_by: list[str] | None = None, **_) -> _Page:
        """The runs whose files read whole; the others are named in `self.damaged` (folder, why)."""
        runs = []
        self.damaged = [(d, f"{RUN} cannot be read") for exp in experiment_ids
                        for d in self._damaged_run_json(self.folder / exp)]
        for exp in experiment_ids:
            for d, info in _run_folders(self.folder / exp):
                try:
                    params, tags = self._check(d, info)
                    points = self._metrics(d)
                except Damaged as e:
                    self.damaged.append((d, str(e)))
                    continue
                latest: dict[str, dict] = {}
                for m in points:  # MLflow's latest value: the highest step, then the newest
                    old = latest.get(m["key"])
                    if old is None or (m["step"], m["timestamp"]) >= (old["step"], old["timestamp"]):
                        latest[m["key"]] = m
                runs.append(SimpleNamespace(
                    info=SimpleNamespace(run_id=info["run_id"], run_name=tags.get("mlflow.runName", ""),
                                         status=info["status"], start_time=info["start_time"],
                                         end_time=info["end_time"], artifact_uri=str(d / ARTIFACTS)),
                    data=SimpleNamespace(params=params, tags=tags,
                                         metrics={k: m["value"] for k, m in latest.items()}),
                    experiment=exp))
        runs.sort(key=lambda r: r.info.start_time, reverse=bool(order_by) and "DESC" in order_by[0])
        return _Page(runs)

    def get_metric_history(self, run_id: str, key: str) -> list:
        d = next(self.folder.glob(f"*/{run_id}"))
        return [SimpleNamespace(**m) for m in self._metrics(d) if m["key"] == key]
