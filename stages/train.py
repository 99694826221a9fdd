"""`pbr train`: the tasks one after another; after each, that task's model, buffer and accuracy row.

Resumable: each finished task is a complete folder `artifacts/train/task_KK/` (written under a
temporary name, then renamed) holding everything needed to continue exactly where it ended,
RNG states included. A re-run continues after the last finished task when the run's fingerprint
(settings, prepared data, code) is unchanged, and starts over otherwise.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

from pbr.errors import UserError
from stages import artifacts, faults, paths, threads
from stages.config import Config

STATE = "state.pt"


def resolve_device(name: str):
    import torch

    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("train.device = cuda but no CUDA device is visible; use auto or cpu")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def settings(cfg: Config) -> tuple[dict, dict]:
    """The run's effective settings with every "auto" resolved (the method's keys: those it
    declares), and where each method value came from (params.yaml, a published best, a default)."""
    from pbr.methods import METHODS

    cls = METHODS[cfg.method.name]
    m, t, mo = cfg.method, cfg.train, cfg.model
    opts, sources = cls.options(cfg.data.dataset, m.buffer_size, lr=t.lr,
                                **{k: getattr(m, k) for k in cls.setting_keys()})
    head, sources["head"] = cls.resolve("head", mo.head, cfg.data.dataset, m.buffer_size)
    dropout, sources["dropout"] = cls.resolve("dropout", mo.dropout, cfg.data.dataset, m.buffer_size)
    return {
        "method": m.name, **vars(opts), "head": head, "dropout": dropout,
        "width": mo.width, "scale": mo.scale,
        "epochs": [cfg.epochs_of(k) for k in range(cfg.data.n_tasks)],
        "batch_size": t.batch_size, "replay_batch_size": t.replay_batch_size,
        "eval_batch_size": t.eval_batch_size, "seed": cfg.seed, "precision": t.precision,
        "channels_last": t.channels_last, "compile": t.compile,
    }, sources


def _code_hash() -> str:
    import pbr
    import stages

    h = hashlib.sha256()
    for pkg in (pbr, stages):
        root = Path(pkg.__file__).parent
        for f in sorted(root.rglob("*.py")):
            h.update(f.relative_to(root.parent).as_posix().encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def fingerprint(s: dict, manifest: dict, device) -> str:
    data = {"shards": [x["sha256"] for x in manifest["shards"]], "order": manifest["class_order"]}
    blob = json.dumps({"settings": s, "data": data, "device": device.type, "code": _code_hash()}, sort_keys=True)
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


def _save_task(out: Path, k: int, net, method, s: dict, rows: dict, epochs: list, ctx, manifest) -> None:
    import pyarrow.parquet as pq
    import torch

    with artifacts.atomic_dir(out / f"task_{k:02d}") as tmp:
        torch.save({"state_dict": net.state_dict(), "task": k, "n_classes": manifest["n_classes"],
                    "classes_seen": sorted(c for t in manifest["task_classes"][: k + 1] for c in t),
                    **{key: s[key] for key in ("width", "head", "scale", "dropout", "method")}}, tmp / "model.pt")
        if method.buffer is not None:
            pq.write_table(buffer_table(method.buffer), tmp / "buffer.parquet")
        (tmp / "accuracy.json").write_text(json.dumps(
            {"task": k, "class_il": rows["class_il"][k], "task_il": rows["task_il"][k], "epochs": epochs[k]},
            indent=1))
        # Written last: a folder with state.pt is a finished task.
        torch.save({"method": method.state_dict(), "generator": ctx.generator.get_state(),
                    "torch_rng": torch.get_rng_state(),
                    "cuda_rng": torch.cuda.get_rng_state_all() if ctx.device.type == "cuda" else None,
                    # As JSON text: pickling the live lists would depend on which strings are shared
                    # objects, so a resumed run's state.pt would differ in bytes from an uninterrupted one's.
                    "log": json.dumps({"rows": rows, "epochs": epochs})}, tmp / STATE)


def _track_task(tracker, k: int, rows: dict, epochs_log: list, epochs: list[int]) -> None:
    """Per-epoch training loss/accuracy (step = global epoch) and per-task accuracy (step = task)."""
    if tracker is None:
        return
    tracker.log_series([(sum(epochs[:k]) + e["epoch"], {"train.loss": e["loss"], "train.accuracy": 100 * e["accuracy"]})
                        for e in epochs_log[k]])
    seen = k + 1
    tracker.log_metrics({"class_il.seen_acc": sum(rows["class_il"][k][:seen]) / seen,
                         "task_il.seen_acc": sum(rows["task_il"][k][:seen]) / seen,
                         "class_il.task_acc_own": rows["class_il"][k][k]}, step=k)


def _finished_tasks(out: Path, n_tasks: int) -> int:
    k = 0
    while k < n_tasks and (out / f"task_{k:02d}" / STATE).is_file():
        k += 1
    return k


def run(cfg: Config, log=print, tracker=None) -> dict:
    import torch

    from pbr import metrics
    from pbr.data.augment import MEAN_STD, Augment, normalize
    from pbr.data.shards import load_manifest
    from pbr.loop import evaluate, fit_task
    from pbr.methods import METHODS, Context, Options
    from pbr.models import Net
    from stages.progress import TaskProgress

    manifest = load_manifest(paths.PREPARED)
    device = resolve_device(cfg.train.device)
    n_threads = threads.configure(cfg.train.threads)
    s, sources = settings(cfg)
    out = paths.TRAIN
    if manifest["n_tasks"] != cfg.data.n_tasks:
        raise UserError(f"{paths.PREPARED} holds {manifest['n_tasks']} tasks but data.n_tasks = {cfg.data.n_tasks}; "
                        f"run dvc repro prepare (or pbr prepare) to rebuild it")
    stream = sum(manifest["task_train_counts"])
    if s["buffer_size"] > stream:
        raise UserError(f"method.buffer_size = {s['buffer_size']} is larger than the whole training stream "
                        f"({stream} samples in {paths.PREPARED}): the buffer would keep every sample; use at "
                        f"most {stream}, or method.name = joint for training on everything")
    if s["compile"] and device.type == "cpu" and s["width"] < 8:
        # torch 2.14's compiled CPU kernels crash the process (double free) at width 4.
        raise UserError(f"train.compile = true with model.width = {s['width']} crashes torch's compiled "
                        f"CPU kernels; use model.width >= 8 or train.compile: false")
    fp = fingerprint(s, manifest, device)
    run_file = out / "run.json"
    if run_file.is_file() and json.loads(run_file.read_text()).get("fingerprint") != fp:
        log(f"{out}: settings, data or code changed since the saved tasks; starting over")
        shutil.rmtree(out)
    if tracker is not None:
        from pbr.data.shards import manifest_hash

        tracker.set_tags({"pbr.data_manifest": manifest_hash(paths.PREPARED), "pbr.device": str(device),
                          "pbr.threads": n_threads,
                          **{f"resolved.{k}": v for k, v in s.items()},
                          **{f"source.{k}": v for k, v in sources.items() if v != "params"}})
    # threads are recorded, not fingerprinted: a run resumed with other threads goes on (results may
    # differ in the last digits, as any change of thread count does on a CPU).
    artifacts.write_text(run_file, json.dumps({"fingerprint": fp, "settings": s, "sources": sources, "device": str(device),
                                               "threads": n_threads,
                                               "n_tasks": manifest["n_tasks"]}, indent=1))

    torch.manual_seed(cfg.seed)
    init_gen = torch.Generator().manual_seed(cfg.seed)  # same initial weights on every device
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    mean, std = MEAN_STD[manifest["dataset"]]
    train_sets, test_sets = _load_tasks(manifest, device)
    task_classes = [torch.tensor(c, device=device) for c in manifest["task_classes"]]
    fmt = torch.channels_last if s["channels_last"] else torch.contiguous_format
    augment = Augment(mean, std)
    ctx = Context(n_classes=manifest["n_classes"], task_classes=task_classes, device=device,
                  augment=lambda x, g: augment(x, g).contiguous(memory_format=fmt),
                  preprocess=lambda x: normalize(x, mean, std).contiguous(memory_format=fmt), generator=gen,
                  replay_batch_size=s["replay_batch_size"], eval_batch_size=s["eval_batch_size"],
                  autocast_dtype=torch.bfloat16 if s["precision"] == "bf16" else None)
    net = Net(manifest["n_classes"], s["width"], s["head"], s["scale"], s["dropout"], generator=init_gen).to(
        device, memory_format=fmt)
    if s["compile"]:
        net.compile()  # the forward only: state_dict keys stay the same; copies (the teacher) run eager
    cls = METHODS[s["method"]]
    opts = Options(lr=s["lr"], buffer_size=max(s["buffer_size"], 1), **{k: s[k] for k in cls.setting_keys()})
    method = METHODS[s["method"]](net, ctx, opts)

    n_tasks = manifest["n_tasks"]
    rows: dict = {"class_il": [], "task_il": []}
    epochs_log: list = []
    start = _finished_tasks(out, n_tasks)
    if start:
        state = torch.load(out / f"task_{start - 1:02d}" / STATE, map_location=device, weights_only=False)
        net.load_state_dict(torch.load(out / f"task_{start - 1:02d}" / "model.pt", map_location=device,
                                       weights_only=False)["state_dict"])
        method.load_state_dict(state["method"])
        gen.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])
        if state["cuda_rng"] is not None:
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        history = json.loads(state["log"])
        rows, epochs_log = history["rows"], history["epochs"]
        log(f"resuming after task {start} of {n_tasks} (finished tasks are kept in {out})")
        for k in range(start):  # this run gets the finished tasks' records too
            _track_task(tracker, k, rows, epochs_log, s["epochs"])

    t_all = time.perf_counter()
    for k in range(start, n_tasks):
        images, labels = method.task_data(k, train_sets)
        method.begin_task(k, images, labels)
        progress = TaskProgress(k, n_tasks, s["epochs"][k], labels.shape[0])

        def on_epoch(e, k=k, progress=progress):
            progress.on_epoch(e)
            faults.point(f"train:task{k}:epoch{e.epoch}")

        try:
            stats = fit_task(method, images, labels, s["epochs"][k], s["batch_size"], progress.on_batch, on_epoch)
        finally:
            progress.close()
        method.end_task(k, images, labels)
        c_row, t_row = evaluate(net, test_sets, task_classes, k + 1, ctx.preprocess, s["eval_batch_size"])
        rows["class_il"].append(c_row)
        rows["task_il"].append(t_row)
        epochs_log.append([{"epoch": e.epoch, "loss": e.loss, "accuracy": e.accuracy} for e in stats])
        _save_task(out, k, net, method, s, rows, epochs_log, ctx, manifest)
        _track_task(tracker, k, rows, epochs_log, s["epochs"])
        log(f"task {k + 1}/{n_tasks} done: Class-IL {[round(a, 2) for a in c_row[: k + 1]]}, "
            f"Task-IL {[round(a, 2) for a in t_row[: k + 1]]}")
        faults.point(f"train:after_task{k}")

    summary = {
        "class_il": {"matrix": rows["class_il"], "acc": metrics.acc(rows["class_il"]),
                     "bwt": metrics.bwt(rows["class_il"]), "forgetting": metrics.forgetting(rows["class_il"])},
        "task_il": {"matrix": rows["task_il"], "acc": metrics.acc(rows["task_il"]),
                    "bwt": metrics.bwt(rows["task_il"]), "forgetting": metrics.forgetting(rows["task_il"])},
        "settings": s,
    }
    artifacts.write_text(out / "accuracy.json", json.dumps(summary, indent=1))
    if tracker is not None:
        tracker.log_artifact(out / "accuracy.json", "train")
    log(f"trained {n_tasks - start} task(s) in {time.perf_counter() - t_all:.0f}s: "
        f"Class-IL ACC {summary['class_il']['acc']:.2f} BWT {summary['class_il']['bwt']:.2f} | "
        f"Task-IL ACC {summary['task_il']['acc']:.2f} BWT {summary['task_il']['bwt']:.2f}")
    return summary
