"""`pbr train`: the tasks one after another; after each, that task's model, buffer and accuracy row.

Resumable: each finished task is a complete folder `artifacts/train/task_KK/` (written under a
temporary name, then renamed) holding everything needed to continue exactly where it ended,
RNG states included. A re-run continues after the last finished task when the run's fingerprint
(settings, prepared data, code) is unchanged, and starts over otherwise. The finished tasks are
also linked outside DVC's outputs (stages/runtime/resume.py), which `dvc exp run` would overwrite.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import time
from pathlib import Path

from pbr.errors import UserError
from stages.runtime import artifacts, faults, mps, paths, resume, threads
from stages.runtime.paths import code_hash  # noqa: F401 (the fingerprint's; tests patch it here)
from stages.runtime.config import Config
from stages.runtime.run_settings import RunSettings, trained_run_params, trained_tags
from stages.pipeline.trained import TASK_FIX, build_method, keeps_buffer, trained_params

STATE = "state.pt"


def resolve_device(name: str):
    import torch

    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("train.device = cuda but no CUDA device is visible; use auto or cpu")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def settings(cfg: Config, device=None) -> RunSettings:
    """The run's settings, every "auto" resolved (precision and memory layout from `device`, by
    default train.device's), with where each value came from."""
    return RunSettings.resolve(cfg, device or resolve_device(cfg.train.device))


def fingerprint(s: RunSettings, manifest: dict, device) -> str:
    data = {"shards": [x["sha256"] for x in manifest["shards"]], "order": manifest["class_order"]}
    blob = json.dumps({"settings": s.values, "data": data, "device": device.type, "code": code_hash()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _load_tasks(manifest: dict, device):
    import torch

    from pbr.data.shards import read_split

    def tensors(task, split):
        s = read_split(paths.PREPARED, manifest, task, split)
        # HWC bytes viewed as NCHW: a channels_last tensor, no copy on the host.
        images = torch.from_numpy(s.images).permute(0, 3, 1, 2).to(device)
        return images, torch.from_numpy(s.labels).to(device)

    n = manifest["n_tasks"]
    return [tensors(t, "train") for t in range(n)], [tensors(t, "test") for t in range(n)]


def buffer_table(buffer):
    """The buffer as a parquet table: the shards' image layout plus task, score and logits."""
    import numpy as np
    import pyarrow as pa

    from pbr.data.shards import image_column

    n = buffer.size
    logits = buffer.logits[:n].cpu().numpy()
    return pa.table({
        "image": image_column(buffer.images[:n].permute(0, 2, 3, 1).cpu().numpy()),
        "label": pa.array(buffer.labels[:n].cpu().numpy().astype(np.int16)),
        "task": pa.array(buffer.tasks[:n].cpu().numpy().astype(np.int16)),
        "score": pa.array(buffer.scores[:n].cpu().numpy()),
        "logits": pa.FixedSizeListArray.from_arrays(pa.array(logits.reshape(-1)), logits.shape[1]),
    })


def _save_task(out: Path, k: int, method, s: RunSettings, rows: dict, epochs: list, manifest) -> None:
    import pyarrow.parquet as pq
    import torch

    ctx = method.ctx
    with artifacts.atomic_dir(out / f"task_{k:02d}") as tmp:
        # The method's model state (the net's state_dict, and whatever else it predicts with), plus
        # the settings that rebuild it (load_method).
        artifacts.save_torch({**method.model_state(), "task": k, "n_classes": manifest["n_classes"],
                            "classes_seen": sorted(c for t in manifest["task_classes"][: k + 1] for c in t),
                            **{key: s[key] for key in ("width", "head", "scale", "dropout", "method")},
                            "settings": s.values}, tmp / "model.pt")
        if method.buffer is not None:
            pq.write_table(buffer_table(method.buffer), tmp / "buffer.parquet")
        (tmp / "accuracy.json").write_text(json.dumps(
            {"task": k, "class_il": rows["class_il"][k], "task_il": rows["task_il"][k], "epochs": epochs[k]},
            indent=1))
        # Written last: a folder with state.pt is a finished task.
        artifacts.save_torch({"method": method.state_dict(), "generator": ctx.generator.get_state(),
                            "torch_rng": torch.get_rng_state(),
                            "cuda_rng": torch.cuda.get_rng_state_all() if ctx.device.type == "cuda" else None,
                            # As JSON text: pickling the live lists would depend on which strings are shared
                            # objects, so a resumed run's state.pt would differ in bytes from an uninterrupted one's.
                            "log": json.dumps({"rows": rows, "epochs": epochs})}, tmp / STATE)


LOGGED = "pbr.train.logged_tasks"  # how many tasks' records the run holds (a killed try's run is joined again)


def _track_task(tracker, k: int, rows: dict, epochs_log: list, epochs: list[int]) -> None:
    """Per-epoch training loss/accuracy (step = global epoch) and per-task accuracy (step = task)."""
    if tracker is None:
        return
    seen = k + 1
    # One call: a kill between the points and the count of logged tasks made the resumed try log
    # the task's points again (each epoch twice in the run's charts). One request to a server; a
    # local sqlite store commits the points and the tags a moment apart, a far narrower window.
    tracker.log_series([(sum(epochs[:k]) + e["epoch"], {"train.loss": e["loss"], "train.accuracy": 100 * e["accuracy"]})
                        for e in epochs_log[k]]
                       + [(k, {"class_il.seen_acc": sum(rows["class_il"][k][:seen]) / seen,
                               "task_il.seen_acc": sum(rows["task_il"][k][:seen]) / seen,
                               "class_il.task_acc_own": rows["class_il"][k][k]})], tags={LOGGED: k + 1})


def _finished_tasks(out: Path, n_tasks: int) -> int:
    """How many tasks from the first are saved whole: state.pt (written last) and every other file,
    the buffer's too where the run keeps one (a file deleted by hand trains that task again)."""
    tasks = [out / f"task_{k:02d}" for k in range(n_tasks)]
    files = [STATE, "model.pt", "accuracy.json"] + (["buffer.parquet"] if keeps_buffer(tasks) else [])
    k = 0
    while k < n_tasks and all((tasks[k] / f).is_file() for f in files):
        k += 1
    return k


class _TaskRecorder:
    """The stage's side of the task loop: progress, fault points, the saved task, MLflow, the log."""

    def __init__(self, out: Path, method, s: dict, manifest: dict, rows: dict, epochs_log: list, tracker, log,
                 fp: str):
        self.out, self.method, self.s, self.manifest = out, method, s, manifest
        self.rows, self.epochs_log, self.tracker, self.log, self.fp = rows, epochs_log, tracker, log, fp
        self.progress = None

    def task_started(self, task: int, n_images: int, epochs: int) -> None:
        from stages.runtime.progress import TaskProgress

        self.progress = TaskProgress(task, self.manifest["n_tasks"], epochs, n_images)

    def batch_done(self, n_images: int) -> None:
        self.progress.on_batch(n_images)

    def epoch_done(self, task: int, e) -> None:
        self.progress.on_epoch(e)
        if not math.isfinite(e.loss):
            # The tasks finished before stay saved; going on would only write NaN models.
            raise UserError(f"training diverged: the loss of task {task + 1} epoch {e.epoch + 1} is {e.loss}; "
                            f"lower train.lr or the method's loss weights (method.* in params.yaml)")
        faults.point(f"train:task{task}:epoch{e.epoch}")

    def task_done(self, k: int, stats, c_row: list[float | None], t_row: list[float | None]) -> None:
        self.progress.close()
        self.rows["class_il"].append(c_row)
        self.rows["task_il"].append(t_row)
        self.epochs_log.append([{"epoch": e.epoch, "loss": e.loss, "accuracy": e.accuracy} for e in stats])
        _save_task(self.out, k, self.method, self.s, self.rows, self.epochs_log, self.manifest)
        resume.keep(self.out, f"task_{k:02d}", self.fp)
        _track_task(self.tracker, k, self.rows, self.epochs_log, self.s["epochs"])
        self.log(f"task {k + 1}/{self.manifest['n_tasks']} done: Class-IL {[round(a, 2) for a in c_row[: k + 1]]}, "
                 f"Task-IL {[round(a, 2) for a in t_row[: k + 1]]}")
        faults.point(f"train:after_task{k}")


def _refuse(cfg: Config, manifest: dict, s: RunSettings, device) -> None:
    """Settings that cannot train on this prepared data or device: one line, before anything is written."""
    from stages.runtime.config import refuse_stale

    if manifest["n_tasks"] != cfg.data.n_tasks:
        raise UserError(f"{paths.PREPARED} holds {manifest['n_tasks']} tasks but data.n_tasks = {cfg.data.n_tasks}; "
                        f"run dvc repro prepare (or pbr prepare) to rebuild it")
    refuse_stale(cfg, manifest)
    stream = sum(manifest["task_train_counts"])
    if s["buffer_size"] > stream:
        raise UserError(f"method.buffer_size = {s['buffer_size']} is larger than the whole training stream "
                        f"({stream} samples in {paths.PREPARED}): the buffer would keep every sample; use at "
                        f"most {stream}, or method.name = joint for training on everything")
    if s["compile"] == "graphs" and device.type != "cuda":
        raise UserError(f"train.compile = graphs needs a CUDA GPU (CUDA graphs); this run trains on {device.type}: "
                        "use train.compile: true or false")
    if s["compile"] and device.type == "cpu" and s["width"] < 8:
        # torch 2.14's compiled CPU kernels crash the process (double free) at width 4.
        raise UserError(f"train.compile = true with model.width = {s['width']} crashes torch's compiled "
                        f"CPU kernels; use model.width >= 8 or train.compile: false")


def _what_changed(saved: dict, s: RunSettings, device) -> str:
    """What of the fingerprint's parts differs from the saved run's run.json: "starting over" names
    it, since an edit anywhere in TRAIN_CODE (a new method's file in pbr/methods too) trains every
    run again, which no setting the user changed would explain."""
    from pbr.data.shards import manifest_hash

    def short(v) -> str:
        text = json.dumps(v)
        return text if len(text) <= 24 else text[:21] + "..."

    said = []
    now, before = json.loads(json.dumps(s.values)), saved.get("settings") or {}
    keys = [k for k in sorted(now.keys() | before.keys()) if now.get(k, ...) != before.get(k, ...)]
    if keys:
        said.append("settings changed (" + ", ".join(
            f"{k} {short(before[k]) if k in before else 'unset'} -> {short(now[k]) if k in now else 'unset'}"
            for k in keys[:4]) + (", ..." if len(keys) > 4 else "") + ")")
    data = manifest_hash(paths.PREPARED)
    if saved.get("data_manifest") not in (None, data):
        said.append(f"data changed ({paths.PREPARED} manifest {saved['data_manifest'][:8]} -> {data[:8]})")
    if saved.get("device") and str(saved["device"]).split(":")[0] != device.type:
        said.append(f"device changed ({saved['device']} -> {device.type})")
    code = code_hash()
    if saved.get("code_sha256") not in (None, code):
        said.append(f"code changed (code_sha256 {saved['code_sha256'][:8]} -> {code[:8]}, the hash of "
                    f"{', '.join(paths.TRAIN_CODE[:3])}, ...: any edit there, a new method's file too)")
    return "; ".join(said) or "settings, data or code changed"


def _keep_or_start_over(out: Path, fp: str, n_tasks: int, log, s: RunSettings, device) -> None:
    """Keep the finished tasks of this very run (taking them back from the resume store where
    `dvc exp run` checked other outputs over them); start over when settings, data or code changed."""
    run_file = out / "run.json"
    saved = artifacts.read_json(run_file, f"delete {out} to train again from the first task, or restore it "
                                "with `dvc checkout --force artifacts/train`") if run_file.is_file() else {}
    saved_fp = saved.get("fingerprint")
    have = _finished_tasks(out, n_tasks) if saved_fp == fp else 0
    back = resume.restore(out, fp, have, lambda p: _finished_tasks(p, n_tasks))
    if back:
        log(f"{out}: took back the {back} finished task(s) of this run from {resume.STORE} (dvc exp run "
            "checks out other outputs over them)")
    elif saved_fp is not None and saved_fp != fp:
        log(f"{out}: {_what_changed(saved, s, device)} since the saved tasks; starting over")
        shutil.rmtree(out)
    elif saved_fp is None and out.is_dir() and any(out.iterdir()):
        log(f"{out}: no run.json says which run its files belong to; starting over")
        shutil.rmtree(out)


def _record_run(out: Path, fp: str, s: RunSettings, device, n_threads: int, n_tasks: int, tracker,
                cfg: Config, start: int = 0) -> None:
    """run.json and the MLflow tags: the resolved settings, where each came from, the machine. No
    commit: the outputs of one training are the same bytes at any commit (the code that shapes them
    is named by its hash, code_sha256)."""
    # threads and GPU sharing are recorded, not fingerprinted: a run resumed with other threads goes
    # on (a thread count moves a CPU run's digits, so finished tasks are not thrown away for it). Each
    # task's count is kept: a run whose tasks trained on different counts says so ("2,2,2,1,1"), and
    # is no run of either count in the report.
    from pbr.data.shards import manifest_hash
    from stages.runtime.tracking import library_versions

    before = (artifacts.read_json(out / "run.json") if start and (out / "run.json").is_file() else {})
    per_task = list(before.get("threads_by_task") or [before.get("threads", n_threads)] * n_tasks)[:start]
    per_task += [n_threads] * (n_tasks - start)
    threads = per_task[0] if len(set(per_task)) == 1 else ",".join(map(str, per_task))
    data = manifest_hash(paths.PREPARED)
    record = {"fingerprint": fp, "settings": s.values, "sources": s.sources, "device": str(device),
              "gpu_sharing": mps.sharing(device), "threads": threads, "threads_by_task": per_task,
              "n_tasks": n_tasks, "params": trained_params(cfg), "code_sha256": code_hash(), "data_manifest": data,
              "versions": library_versions()}  # this try's, as device and threads are
    if tracker is not None:
        tracker.set_tags({"pbr.data_manifest": data, **trained_tags(record)})
        tracker.log_new_params(trained_run_params(record))
    artifacts.write_text(out / "run.json", json.dumps(record, indent=1))
    resume.keep(out, "run.json", fp)


def _threads_of_the_run(out: Path, start: int, setting, n_threads: int, log) -> int:
    """Under `auto` (no OMP_NUM_THREADS), a resumed run goes on at the thread count its last finished
    task trained with: `auto` follows the machine's load, and a CPU run's digits follow its thread
    count, so a kill and a resume would otherwise end with another run's metrics than the
    uninterrupted one's. A count given (train.threads, OMP_NUM_THREADS) is the user's to keep."""
    import torch

    if setting != "auto" or threads.given_by_environment():
        return n_threads
    try:
        before = json.loads((out / "run.json").read_text())
        then = int((before.get("threads_by_task") or [before["threads"]] * start)[start - 1])
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return n_threads
    if then != n_threads:
        torch.set_num_threads(then)
        log(f"train.threads auto: resuming on the {then} thread(s) its finished tasks trained with (now {n_threads} "
            "would be picked), so it ends as the uninterrupted run")
    return then


def _restore(method, out: Path, start: int, device, gen) -> tuple[dict, list]:
    """The method, the generators and the logs as they were after finished task `start`."""
    import torch

    last = out / f"task_{start - 1:02d}"
    def load(p):
        return artifacts.read(p, lambda f: torch.load(f, map_location=device, weights_only=False), TASK_FIX)

    state = load(last / STATE)
    method.load_model_state(load(last / "model.pt"))
    method.load_state_dict(state["method"])
    # RNG states are CPU byte tensors whatever the device (map_location moved them).
    gen.set_state(state["generator"].cpu())
    torch.set_rng_state(state["torch_rng"].cpu())
    if state["cuda_rng"] is not None:
        torch.cuda.set_rng_state_all([r.cpu() for r in state["cuda_rng"]])
    history = json.loads(state["log"])
    return history["rows"], history["epochs"]


def _build_or_refuse(s: RunSettings, manifest: dict, device, gen, init_gen):
    import torch

    try:
        return build_method(s, manifest, device, gen, init_gen)
    except (torch.OutOfMemoryError, MemoryError, RuntimeError) as e:
        if not isinstance(e, (torch.OutOfMemoryError, MemoryError)) and "allocate" not in str(e):
            raise
        busy = " (or wait for the other processes on it)" if device.type == "cuda" else ""
        raise UserError(f"model.width = {s['width']}: the network does not fit in {device}'s memory; "
                        f"use a smaller model.width{busy}") from None


def check(cfg: Config) -> None:
    """What the stage refuses before it starts: no prepared data, data prepared with other settings,
    or a compile on a CPU with no C++ compiler."""
    from pbr.data.shards import load_manifest
    from stages.runtime.config import refuse_stale

    refuse_stale(cfg, load_manifest(paths.PREPARED))
    if cfg.train.compile is True and resolve_device(cfg.train.device).type == "cpu":
        _refuse_without_compiler()


def _refuse_without_compiler() -> None:
    """Inductor builds its CPU kernels with a C++ compiler (CXX, else g++): without one the first
    step failed after the saved tasks were replaced, in a 400-line traceback. Inductor's own search
    (`<compiler> --version`), so that what it finds here is what it uses."""
    from torch._inductor import config, cpp_builder, exc

    try:
        cpp_builder.get_cpp_compiler()
    except (exc.InvalidCxxCompiler, OSError):  # CXX a folder or a file not executable: PermissionError
        tried = ", ".join(c for c in config.cpp.cxx if c) if isinstance(config.cpp.cxx, (list, tuple)) else config.cpp.cxx
        raise UserError(f"train.compile needs a C++ compiler on a CPU (none found: {tried} does not run; set CXX "
                        "to one) or set train.compile: false") from None


def run(cfg: Config, log=print, tracker=None) -> dict:
    import torch

    from pbr.data.shards import load_manifest
    from pbr.loop import train_tasks

    manifest = load_manifest(paths.PREPARED)
    # What a killed prepare left (tens of MB): DVC may restore that stage from its cache and never run it again.
    artifacts.clean_stale(paths.PREPARED)
    n_tasks = manifest["n_tasks"]
    device = resolve_device(cfg.train.device)
    n_threads = threads.configure(cfg.train.threads)
    if cfg.train.threads != "auto" and n_threads > (cores := threads.available_cores()):
        log(f"warning: train.threads = {n_threads} is more than the {cores} core(s) this process may use: the "
            f"threads take turns on them (slower); use at most {cores}, or auto")
    s = settings(cfg, device)
    out = paths.TRAIN
    _refuse(cfg, manifest, s, device)
    if "hardware" in s.sources:
        log(f"train.precision / train.channels_last auto on {device}: {s.sources['hardware']}")
    fp = fingerprint(s, manifest, device)

    torch.manual_seed(cfg.seed)
    init_gen = torch.Generator().manual_seed(cfg.seed)  # same initial weights on every device
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    # Built before anything saved is touched: a network that does not fit leaves the saved run as it was.
    method = _build_or_refuse(s, manifest, device, gen, init_gen)
    _keep_or_start_over(out, fp, n_tasks, log, s, device)
    start = _finished_tasks(out, n_tasks)
    logged = int(tracker.joined.get(LOGGED, 0)) if tracker is not None else 0
    # A try killed before its first task logged none, but its resolved settings are params already,
    # which MLflow never changes: resolved otherwise now (an uncommitted edit of a method's best, a
    # GPU come or gone under auto), the run would hold one try's params and the other's tags.
    held = {k: v for k, v in (tracker.joined if tracker is not None else {}).items() if k.startswith("resolved.")}
    resolved_otherwise = any(held.get(k, str(v)) != str(v) for k, v in s.tags().items() if k.startswith("resolved."))
    if (logged and (tracker.joined.get("pbr.fingerprint") != fp or logged > start)) or resolved_otherwise:
        # The killed try this stage joined logged another training (the code or data changed since,
        # with the commit and params the same) or tasks now trained again: its records stay its own.
        tracker.start_over()
        logged = 0
    if start:
        n_threads = _threads_of_the_run(out, start, cfg.train.threads, n_threads, log)
    _record_run(out, fp, s, device, n_threads, n_tasks, tracker, cfg, start)
    train_sets, test_sets = _load_tasks(manifest, device)
    if s["compile"]:
        # The network's forward (and backward): state_dict keys stay the same; copies (the teacher) run eager.
        method.ctx.cuda_graphs = s["compile"] == "graphs"
        method.net.compile(mode="reduce-overhead" if method.ctx.cuda_graphs else None)

    rows: dict = {"class_il": [], "task_il": []}
    epochs_log: list = []
    if start:
        try:
            rows, epochs_log = _restore(method, out, start, device, gen)
        except UserError:
            # A damaged task: its copy in the resume store is the same file (a hard link), and would come
            # back in place of the task folder the error says to delete.
            resume.forget(fp)
            raise
        log(f"resuming after task {start} of {n_tasks} (finished tasks are kept in {out})")
        # This run gets the finished tasks' records too, those a killed try of it has not logged.
        for k in range(logged, start):
            _track_task(tracker, k, rows, epochs_log, s["epochs"])

    t_all = time.perf_counter()
    recorder = _TaskRecorder(out, method, s, manifest, rows, epochs_log, tracker, log, fp)
    try:
        train_tasks(method, train_sets, test_sets, s["epochs"], s["batch_size"], start, s["eval_batch_size"], recorder)
    finally:
        if recorder.progress is not None:
            recorder.progress.close()

    # The accuracy matrices; their metrics (ACC, BWT, forgetting) are the evaluate stage's.
    summary = {"class_il": {"matrix": rows["class_il"]}, "task_il": {"matrix": rows["task_il"]}, "settings": s.values}
    artifacts.write_text(out / "accuracy.json", json.dumps(summary, indent=1))
    # The run's resume store stays: DVC commits artifacts/train only after this process exits, and a
    # `dvc exp run` killed before that checks other outputs over it. The score and evaluate stages,
    # which DVC starts only once this stage is committed, let it go.
    if tracker is not None:
        tracker.log_artifact(out / "accuracy.json", "train")
    last_c, last_t = rows["class_il"][-1], rows["task_il"][-1]
    log(f"trained {n_tasks - start} task(s) in {time.perf_counter() - t_all:.0f}s: final row mean (ACC) "
        f"Class-IL {sum(last_c) / len(last_c):.2f} | Task-IL {sum(last_t) / len(last_t):.2f}")
    faults.point("train:done")  # the stage's work done, DVC's commit of it not yet
    return summary
