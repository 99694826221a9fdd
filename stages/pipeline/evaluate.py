"""`pbr evaluate`: the accuracy matrices and per-task snapshots written by train -> metrics and plots.

reports/metrics.json (for `dvc metrics show` / `dvc exp show`): ACC, BWT, forgetting and the
minority tasks' accuracy for Class-IL and Task-IL, in percent like the paper. Beside it under
reports/eval/: the matrices as CSV, the per-class classifier weight norms and buffer class
histograms after each task, and PNG renderings.
"""

from __future__ import annotations

import json

from pbr.metrics import minority_tasks, scenario_metrics
from stages.pipeline.trained import (  # noqa: F401 (check: asked by the CLI before the stage's run begins)
    TASK_FIX, check, check_trained, finished_summary, keeps_buffer, let_the_resume_store_go, saved_run_params,
    saved_run_tags)
from stages.runtime import artifacts, faults, paths, plots


def _head_norms(model_path, manifest) -> list[float]:
    import torch

    from stages.pipeline.trained import load_method

    cpu = torch.device("cpu")
    method, _ = load_method(model_path, manifest, cpu, torch.Generator(device=cpu))
    return method.classifier_norms().tolist()


def _buffer_hist(path, n_classes: int, has_buffer: bool) -> list[int]:
    """The buffer's class counts after a task; zeros for a method without a buffer."""
    if not has_buffer:
        return [0] * n_classes
    import numpy as np
    import pyarrow.parquet as pq

    labels = artifacts.read(path, lambda p: pq.read_table(p, columns=["label"]), TASK_FIX).column("label").to_numpy()
    return np.bincount(labels, minlength=n_classes).tolist()


def dvc_lock_hashes(lock_path=paths.DVC_LOCK, params_path=paths.DVC_LOCK.with_name("params.yaml"),
                    under_dvc: bool | None = None) -> dict[str, str]:
    """md5 of every output of the stages whose outputs this stage reads (the prepared data, the trained
    models and buffers), as dvc.lock records them: how MLflow links to them. DVC runs and records
    those before this stage; any other stage's entry (score's, this stage's own) may be an earlier
    execution's while this one runs. None when DVC does not run this stage (`pbr train` and
    `pbr evaluate` by hand: dvc.lock still names the outputs of DVC's last run, before any edit of
    the code or params since), or when dvc.lock's entry for them was recorded with other params than
    params.yaml holds now."""
    import os

    from stages.runtime.yaml12 import read_yaml

    if under_dvc is None:
        under_dvc = "DVC_STAGE" in os.environ  # DVC sets it for every stage command it runs
    if not under_dvc or not lock_path.is_file():
        return {}
    lock = read_yaml(lock_path.read_text()) or {}
    now = (read_yaml(params_path.read_text()) if params_path.is_file() else None) or {}
    reads = {paths.PREPARED.as_posix(), paths.TRAIN.as_posix()}
    stages = [st for st in (lock.get("stages") or {}).values()
              if any(o["path"] in reads for o in st.get("outs", []) or [])]
    for st in stages:
        recorded = (st.get("params") or {}).get(params_path.name) or {}
        if any(now.get(key) != value for key, value in recorded.items()):
            return {}
    outs = [o for st in stages for o in st["outs"]]
    if not all(_lock_names_the_workspace(o, lock_path.parent) for o in outs if o["path"] in reads):
        return {}
    return {f"dvc.md5.{o['path']}": o.get("md5", "") for o in outs}


# The file each output rewrites whenever it is made again: its md5 in DVC's listing of the folder says
# whether the folder there now is the one dvc.lock names.
_MARKERS = {paths.PREPARED.as_posix(): "manifest.json", paths.TRAIN.as_posix(): "run.json",
            paths.SCORE.as_posix(): "scores.parquet"}


def scored_this_training(linked: dict[str, str], lock_path=paths.DVC_LOCK,
                         params_path=paths.DVC_LOCK.with_name("params.yaml")) -> bool:
    """Whether artifacts/score is the scoring of the data and models of this execution (`linked`,
    dvc_lock_hashes' answer) with the params.yaml of now: dvc.lock's score entry read them, with these
    params, and names the folder there. So when DVC skipped score (nothing it reads changed); not
    after `dvc repro evaluate` following a training that was never scored."""
    from stages.runtime.yaml12 import read_yaml

    if not linked:
        return False
    entry = ((read_yaml(lock_path.read_text()) or {}).get("stages") or {}).get("score") or {}
    now = (read_yaml(params_path.read_text()) if params_path.is_file() else None) or {}

    def param(key):  # a dotted key (train.eval_batch_size) as DVC records it, or a section
        value = now
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        return value

    recorded = (entry.get("params") or {}).get(params_path.name) or {}
    read = {d.get("path"): d.get("md5") for d in entry.get("deps") or []}
    inputs = [p.as_posix() for p in (paths.PREPARED, paths.TRAIN)]
    outs = [o for o in entry.get("outs") or [] if o.get("path") == paths.SCORE.as_posix()]
    return (all(param(k) == v for k, v in recorded.items())
            and all(read.get(p) == linked.get(f"dvc.md5.{p}") for p in inputs)
            and len(outs) == 1 and _lock_names_the_workspace(outs[0], lock_path.parent))


def _lock_names_the_workspace(out: dict, root) -> bool:
    """Whether the folder the lock entry `out` names is the one in the workspace: `pbr train` by hand
    (the code edited, the params not), then `dvc repro -s evaluate`, left the lock naming the earlier
    models, and the tag named models this run never read. Read from DVC's listing of the folder in
    its cache; without one (no cache, another layout) nothing says so, and no tag is given."""
    import hashlib
    import json
    from pathlib import Path

    md5 = str(out.get("md5", ""))
    marker = _MARKERS.get(out["path"])
    if not md5.endswith(".dir") or marker is None:
        return False
    root = Path(root)
    caches = [root / ".dvc" / "cache"]
    try:  # a cache moved with `dvc cache dir` (--local, the repository's, --global, --system): DVC's own reading
        from dvc.config import Config

        moved = Config(dvc_dir=str(root / ".dvc"))["cache"].get("dir")
        if moved:
            caches.insert(0, Path(moved))
    except Exception:  # no DVC here, or a config it refuses: the default place only
        pass
    for cache in caches:
        for listing in (cache / "files" / "md5" / md5[:2] / md5[2:], cache / md5[:2] / md5[2:]):
            if listing.is_file():
                try:
                    entries = {e["relpath"]: e["md5"] for e in json.loads(listing.read_text())}
                except (ValueError, KeyError, TypeError):
                    return False
                here = Path(root) / out["path"] / marker
                return here.is_file() and entries.get(marker) == hashlib.md5(here.read_bytes()).hexdigest()
    return False


def run(cfg, log=print, tracker=None) -> dict:
    from pbr.data.shards import load_manifest
    from pbr.methods import METHODS

    summary = finished_summary()
    manifest = load_manifest(paths.PREPARED)
    check_trained(cfg, manifest)
    n_tasks, n_classes = manifest["n_tasks"], manifest["n_classes"]
    minority = minority_tasks(manifest["task_train_counts"])
    # Every task's model and buffer read before the first file is written: a damaged one stops the
    # stage with reports/eval as it was, not half of it new.
    norms = [_head_norms(paths.TRAIN / f"task_{k:02d}" / "model.pt", manifest) for k in range(n_tasks)]
    tasks = [paths.TRAIN / f"task_{k:02d}" for k in range(n_tasks)]
    buffered = keeps_buffer(tasks)
    hist = [_buffer_hist(t / "buffer.parquet", n_classes, buffered) for t in tasks]

    # A method with no Class-IL prediction (PNN: one column per task, asked with the task's id) has
    # no Class-IL metrics: its matrix (the newest column's answers) stays in the CSV, the paper's "-".
    method = METHODS[summary["settings"]["method"]]
    modes = ("class_il", "task_il") if method.class_il else ("task_il",)
    # Its earlier rows are an untrained network's (JOINT): no BWT or forgetting to read off them.
    drop = set() if method.learns_each_task else {"bwt", "forgetting"}
    result = {"method": summary["settings"]["method"], "n_tasks": n_tasks, "minority_tasks": minority}
    # reports/eval (this stage's alone) is written whole in a temporary folder that replaces it in one
    # rename: `pbr evaluate` by hand killed midway left the new CSVs beside the old plots and metrics.json.
    with artifacts.atomic_dir(paths.EVAL) as out:
        for scen in ("class_il", "task_il"):
            m = summary[scen]["matrix"]
            if scen in modes:
                result[scen] = {**{k: v for k, v in scenario_metrics(m, minority).items() if k not in drop},
                                "final_per_task": m[-1]}
            # A task not learned yet (i > j) is not evaluated: null in accuracy.json ("nan" here, as in
            # accuracy_curve.csv below), also where a run trained before that holds its 0 or chance.
            rows = [{"after_task": j, **{f"task_{i}": float("nan") if i > j or v is None else round(v, 4)
                                         for i, v in enumerate(r)}} for j, r in enumerate(m)]
            artifacts.write_csv(out / f"{scen}_matrix.csv", rows)
        # NaN where the matrices above are no results: a mode the method has no metrics of (PNN's
        # Class-IL), rows before the last of a method that learns at the last task only (JOINT). NaN, not
        # an empty cell: DVC's plot (Vega) drops "nan" but reads "" as 0.
        curve = [{"after_task": j, **{scen: round(sum(summary[scen]["matrix"][j][: j + 1]) / (j + 1), 4)
                                      if scen in modes and (method.learns_each_task or j == n_tasks - 1)
                                      else float("nan") for scen in ("class_il", "task_il")}} for j in range(n_tasks)]
        artifacts.write_csv(out / "accuracy_curve.csv", curve)
        artifacts.write_csv(out / "weight_norms.csv", [
            {"after_task": k, "class": c, "norm": round(v, 6)} for k in range(n_tasks) for c, v in enumerate(norms[k])])
        # The bar plots' axis: DVC sorts it as text, so "010" after "009" (and the class named), not "10" after "1".
        def named(c):
            return f"{c:03d} {manifest['class_names'][c]}"

        artifacts.write_csv(out / "weight_norms_final.csv", [
            {"label": c, "class": named(c), "norm": round(v, 6)} for c, v in enumerate(norms[-1])])
        artifacts.write_csv(out / "buffer_histogram.csv", [
            {"after_task": k, "class": c, "count": v} for k in range(n_tasks) for c, v in enumerate(hist[k])])
        artifacts.write_csv(out / "buffer_final.csv", [{"label": c, "class": named(c), "count": v}
                                                       for c, v in enumerate(hist[-1])])
        faults.point("evaluate:partial")

        def shown(m):  # JOINT's rows before the last are an untrained network's: not drawn as results
            return m if method.learns_each_task else [[float("nan")] * len(r) for r in m[:-1]] + [m[-1]]

        drawn = {name: shown(summary[s]["matrix"]) for name, s in (("Class-IL", "class_il"), ("Task-IL", "task_il"))
                 if s in modes}
        plots.heatmaps(drawn, out / "matrices.png", note="" if method.learns_each_task else
                       f"{method.label} learns at the last task only: its earlier rows are left out")
        plots.task_curves(drawn.get("Class-IL"), "Class-IL accuracy of each task" if "Class-IL" in drawn else
                          f"{method.label} has no Class-IL prediction (it is asked with the task's id)",
                          out / "class_il_curves.png")
        seen = [set().union(*map(set, manifest["task_classes"][: k + 1])) for k in range(n_tasks)]
        cosine = summary["settings"].get("head") == "cosine"
        plots.bars_by_task([[v if c in seen[k] else float("nan") for c, v in enumerate(norms[k])]
                            for k in range(n_tasks)],
                           "||w_c||", "Classifier weight norm per class seen (biased prototypes)" +
                           ("; a cosine head's logits use w_c / ||w_c||" if cosine else ""), out / "weight_norms.png")
        plots.bars_by_task(hist, "samples in buffer", "Buffer class histogram after each task",
                           out / "buffer_histogram.png")
        # metrics.json goes before the folder is replaced and comes back last: killed between, its absence
        # (DVC's state when it runs the stage) says the reports are not whole.
        paths.METRICS.unlink(missing_ok=True)

    metrics_json = {s: {k: [round(x, 4) for x in v] if k == "final_per_task" else round(v, 4)
                        for k, v in result[s].items()} for s in modes}
    artifacts.write_text(paths.METRICS, json.dumps(metrics_json, indent=1))

    if tracker is not None:
        flat = {f"{s}.{k}": v for s in modes for k, v in result[s].items() if k != "final_per_task"}
        tracker.log_once("pbr.evaluate.logged", [(0, flat)] + [
            (t, {f"{s}.final_task_acc": result[s]["final_per_task"][t] for s in modes}) for t in range(n_tasks)])
        faults.point("evaluate:logged")
        tracker.log_artifact(paths.METRICS, "evaluate")
        for f in sorted(paths.EVAL.iterdir()):
            if f.suffix in (".csv", ".png"):
                tracker.log_artifact(f, "evaluate")
        # A run holds what the stages that ran logged: where DVC skipped prepare (its output cached, as
        # in every run after the first) or score (nothing it reads changed), their records come from
        # their outputs here, so that a complete run holds every stage's.
        from stages.pipeline import prepare, score

        if tracker.joined.get("pbr.stage.prepare") != "done":
            prepare.record(manifest, tracker)
        linked = dvc_lock_hashes()
        if tracker.joined.get("pbr.stage.score") != "done" and scored_this_training(linked):
            score.record_outputs(cfg, manifest, summary["settings"], tracker)
        tracker.log_new_params(saved_run_params())
        tracker.set_tags({**saved_run_tags(), **linked, "pbr.complete": "true"})
    # Last: a run killed before here (in scoring or evaluating) and queued again starts from the
    # baseline's outputs, so its training is taken back from the store rather than done again.
    let_the_resume_store_go()

    def f(scen: str, key: str) -> str:
        v = result[scen].get(key)
        return "-" if v is None else f"{v:.2f}"

    log((f"Class-IL ACC {f('class_il', 'acc')} BWT {f('class_il', 'bwt')} forgetting {f('class_il', 'forgetting')} "
         f"minority {f('class_il', 'minority_acc')}" if "class_il" in result else "Class-IL - (no Class-IL prediction)") +
        f" | Task-IL ACC {f('task_il', 'acc')} BWT {f('task_il', 'bwt')}")
    return result
