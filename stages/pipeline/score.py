"""`pbr score`: MC-dropout mutual information and predictive entropy of every training and test
sample, and whether it was forgotten (right after its own task, wrong at the end).

Each sample is scored by the model of the end of its own task (its uncertainty when learned)
and by the final model. Output: artifacts/score/scores.parquet; per-class summaries and the
paper's motivation plots (uncertainty against class frequency; forgotten against kept samples
by uncertainty) under reports/score/. Each scored task is also kept in .pbr/resume (as the train
stage keeps its tasks), so a killed scoring goes on from its last finished task.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from stages.pipeline import trained
from stages.runtime import artifacts, faults, paths, plots, resume, threads

COLUMNS = ("split", "index", "label", "task", "class_count", "mi", "entropy", "correct_own", "mi_final",
           "entropy_final", "correct_final")


def check(cfg) -> None:
    """What the stage refuses before it starts (asked by the CLI before its MLflow run begins): what
    score and evaluate share (trained.check), and output folders it cannot write, found before the
    scoring's minutes rather than after them."""
    trained.check(cfg)
    from pbr.data.shards import load_manifest
    from pbr.errors import UserError

    # Every task's model is read in turn: one missing is said now, not after the tasks before it.
    for k in range(load_manifest(paths.PREPARED)["n_tasks"]):
        model = paths.TRAIN / f"task_{k:02d}" / "model.pt"
        if not model.is_file():
            raise UserError(f"{model} is missing; {trained.TASK_FIX}")
    for folder in (paths.SCORE, paths.SCORE_REPORTS):
        artifacts.writable_folder(folder)


def _fingerprint(last, T, tau, batch_size, dropout, backbone, seed, device) -> str:
    """What a scoring depends on: the trained run (its fingerprint and final weights), the
    scoring's settings and code. A killed scoring with the same fingerprint takes its tasks back."""
    run = artifacts.read_json(paths.TRAIN / "run.json").get("fingerprint") if (
        paths.TRAIN / "run.json").is_file() else None
    from stages.runtime.paths import SCORE_CODE, code_hash

    # All of it (the network's and the method's too): tasks scored by other code are not taken back.
    blob = json.dumps({"kind": "score", "run": run, "final": hashlib.sha256(last.read_bytes()).hexdigest(),
                       "settings": [T, tau, batch_size, dropout, backbone, seed], "device": device.type,
                       "code": code_hash(entries=SCORE_CODE)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _keep(fp: str, k: int, part: dict, generator_state) -> None:
    """Task k's scores and the generator's state after them, in the run's resume store: the
    score stage's output is replaced whole at the end, so a killed scoring keeps its tasks here."""
    import io

    import numpy as np

    buf = io.BytesIO()
    np.savez(buf, _generator=generator_state, **part)
    artifacts.write_bytes(resume.store_for(fp) / f"score_{k:02d}.npz", buf.getvalue())


def _take_back(fp: str, n_tasks: int) -> tuple[list[dict], int]:
    """The kept tasks 0..k-1 of this scoring (each with its generator state), and k."""
    import numpy as np
    import torch

    store, parts = resume.store_for(fp), []
    while len(parts) < n_tasks and (store / f"score_{len(parts):02d}.npz").is_file():
        try:
            with np.load(store / f"score_{len(parts):02d}.npz") as z:
                part = {c: z[c] for c in COLUMNS}
                part["_generator"] = torch.from_numpy(z["_generator"])
        except Exception:  # a damaged kept task: scored again, with those after it
            break
        parts.append(part)
    for p in parts[:-1]:
        p.pop("_generator")
    return parts, len(parts)


def _score(method, images, T, tau, batch_size, pre, gen, classes, dropout, backbone, task, task_classes):
    """MC-dropout MI and entropy of the method's network, and the method's own prediction: Class-IL
    over `classes`, read off the same pass when the method predicts with its network; a method that
    uses the task identity predicts with it, over the sample's task's classes."""
    import torch

    from pbr.uncertainty import score_and_predict

    net = method.mc_network()
    if net is None:  # the method has no single head to sample: no MC-dropout score
        nan = torch.full((images.shape[0],), float("nan"), device=classes.device)
        mi, ent, pred = nan, nan.clone(), None
    else:
        mi, ent, pred = score_and_predict(net, images, T, tau, batch_size, pre, gen, classes, dropout, backbone)
    if pred is None or not method.predicts_with_net:
        given = task if method.uses_task_identity else None
        among = task_classes if method.uses_task_identity else classes
        with torch.inference_mode():
            device = classes.device
            scores = torch.cat([method.predict(pre(images[i:i + batch_size].to(device)), task=given)
                                for i in range(0, images.shape[0], batch_size)])
            pred = among[scores.index_select(1, among).argmax(1)]
    return mi, ent, pred


@dataclass
class _Scoring:
    """What scoring every task shares: the data, the final model, the MC settings, the generator."""

    manifest: dict
    device: Any
    gen: Any
    final: Any
    T: int
    tau: float
    batch_size: int
    dropout: float
    backbone: bool
    pre: Callable

    def task(self, k: int) -> dict:
        """Task k's training and test samples scored by the model of task k's end and the final one."""
        import numpy as np
        import torch

        from pbr.data.shards import read_split
        from stages.pipeline.trained import load_method

        m, dev = self.manifest, self.device
        own, _ = load_method(paths.TRAIN / f"task_{k:02d}" / "model.pt", m, dev, self.gen)
        seen = torch.tensor(sorted(c for t in m["task_classes"][: k + 1] for c in t), device=dev)
        every = torch.tensor(sorted(c for t in m["task_classes"] for c in t), device=dev)
        own_classes = torch.tensor(m["task_classes"][k], device=dev)
        cols: dict[str, list] = {c: [] for c in COLUMNS}
        for split in ("train", "test"):
            s = read_split(paths.PREPARED, m, k, split)
            images = torch.from_numpy(s.images).permute(0, 3, 1, 2)
            labels = torch.from_numpy(s.labels).to(dev)
            args = (self.T, self.tau, self.batch_size, self.pre, self.gen)
            mi, ent, pred = _score(own, images, *args, seen, self.dropout, self.backbone, k, own_classes)
            mi_f, ent_f, pred_f = _score(self.final, images, *args, every, self.dropout, self.backbone, k, own_classes)
            n = len(s.labels)
            cols["split"].append(np.full(n, split))
            cols["index"].append(s.indices)
            cols["label"].append(s.labels)
            cols["task"].append(np.full(n, k))
            cols["class_count"].append(np.asarray(m["train_counts"])[s.labels])
            for name, v in (("mi", mi), ("entropy", ent), ("mi_final", mi_f), ("entropy_final", ent_f)):
                cols[name].append(v.float().cpu().numpy())
            cols["correct_own"].append((pred == labels).cpu().numpy())
            cols["correct_final"].append((pred_f == labels).cpu().numpy())
        return {c: np.concatenate(v) for c, v in cols.items()}


def _setup(cfg) -> tuple[_Scoring, Path]:
    """The scoring's settings, "auto" answered by the trained run's own method."""
    import torch

    from pbr.data.augment import MEAN_STD, normalize
    from pbr.data.shards import load_manifest
    from pbr.errors import UserError
    from stages.pipeline.train import resolve_device
    from stages.pipeline.trained import check_trained, load_method

    manifest = load_manifest(paths.PREPARED)
    check_trained(cfg, manifest)
    last = paths.TRAIN / f"task_{manifest['n_tasks'] - 1:02d}" / "model.pt"
    if not last.is_file():
        raise UserError(f"{last} is missing: training has not finished; run `dvc repro train`")
    device = resolve_device(cfg.train.device)
    threads.configure(cfg.train.threads)
    mean, std = MEAN_STD[manifest["dataset"]]
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    final, saved = load_method(last, manifest, device, gen)
    r = resolved(cfg, saved["settings"])
    return _Scoring(manifest, device, gen, final, r["mc_samples"], r["temperature"], cfg.train.eval_batch_size,
                    r["dropout"], r["backbone"], lambda x: normalize(x, mean, std)), last


def resolved(cfg, settings: dict) -> dict:
    """The scoring's settings, each "auto" answered by the method from the trained run's own settings
    (`settings`, as its saved tasks keep them; not today's params.yaml)."""
    from stages.runtime.run_settings import RunSettings

    run = RunSettings.saved(settings)
    return {"dropout": cfg.score.dropout if cfg.score.dropout != "auto" else run.score_dropout(),
            "temperature": cfg.score.temperature if cfg.score.temperature != "auto" else run.score_temperature(),
            "mc_samples": cfg.score.mc_samples if cfg.score.mc_samples != "auto" else run.score_samples(),
            "backbone": run.score_backbone()}


def run(cfg, log=print, tracker=None) -> dict:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    sc, last = _setup(cfg)
    n_tasks = sc.manifest["n_tasks"]
    fp = _fingerprint(last, sc.T, sc.tau, sc.batch_size, sc.dropout, sc.backbone, cfg.seed, sc.device)
    parts, start = _take_back(fp, n_tasks)
    if start:
        sc.gen.set_state(parts[-1].pop("_generator"))
        log(f"scoring: took back tasks 1-{start} of this scoring from {resume.STORE}" +
            (f"; resuming at task {start + 1}" if start < n_tasks else " (all of them)"))
    for k in range(start, n_tasks):
        parts.append(sc.task(k))
        _keep(fp, k, parts[-1], sc.gen.get_state().numpy())
        log(f"scored task {k + 1}/{n_tasks}")
        faults.point(f"score:after_task{k}")
    data = {c: np.concatenate([p[c] for p in parts]) for c in COLUMNS}
    data["forgotten"] = data["correct_own"] & ~data["correct_final"]
    table = pa.table({k: pa.array(v) for k, v in data.items()})
    with artifacts.atomic_dir(paths.SCORE) as tmp:
        pq.write_table(table, tmp / "scores.parquet")
    summary = _summaries(data, sc.manifest, sc.final.learns_each_task)
    if tracker is not None:
        record(tracker, summary, {"dropout": sc.dropout, "temperature": sc.tau, "mc_samples": sc.T,
                                  "backbone": sc.backbone})
    # Last, so that only DVC's commit of these small outputs is left unguarded by the store.
    resume.forget(fp)
    log(f"wrote {paths.SCORE / 'scores.parquet'} ({len(data['label'])} samples): mean MI {summary['score.mean_mi']:.4g}, "
        f"forgotten {100 * summary['score.forgotten_rate']:.1f}% (MI {summary['score.mi_forgotten']:.3g} vs kept "
        f"{summary['score.mi_kept']:.3g})")
    return summary


def record(tracker, summary: dict, settings: dict) -> None:
    """The stage's record in the run: the summary metrics, reports/score, the scores' hash and the
    scoring's resolved `settings`. The evaluate stage records it too where DVC did not run this stage
    (nothing it reads changed): record_outputs."""
    import hashlib

    from pbr.data.shards import manifest_hash
    from stages.pipeline.trained import saved_run_tags

    # An empty group's figure (no sample forgotten: score.mi_forgotten) is none: not logged as NaN.
    tracker.log_once("pbr.score.logged", [(0, {k: v for k, v in summary.items() if not math.isnan(v)})])
    faults.point("score:logged")
    for f in sorted(paths.SCORE_REPORTS.iterdir()):
        tracker.log_artifact(f, "score")
    # A run where only scoring changed holds no train stage: what it scored is said here too. The
    # scores file itself (no artifact: DVC keeps it) is named by its hash.
    scores = hashlib.sha256((paths.SCORE / "scores.parquet").read_bytes()).hexdigest()
    tracker.set_tags({"pbr.data_manifest": manifest_hash(paths.PREPARED), **saved_run_tags(),
                      "pbr.score_sha256": scores, **{f"score.resolved.{k}": v for k, v in settings.items()}})


def record_outputs(cfg, manifest: dict, settings: dict, tracker) -> None:
    """`record` from the stage's outputs as they are (scores.parquet, reports/score), for the trained
    run's `settings`."""
    import pyarrow.parquet as pq

    from pbr.methods import METHODS

    table = artifacts.read(paths.SCORE / "scores.parquet", pq.read_table, "run `dvc repro score`")
    data = {c: table.column(c).to_numpy(zero_copy_only=False) for c in table.column_names}
    record(tracker, summary_of(data, manifest, METHODS[settings["method"]].learns_each_task),
           resolved(cfg, settings))


def _rate(flags) -> float:  # forgotten among the learned (right after a task before the last); NaN where none was
    return float(flags.mean()) if flags.size else float("nan")


def _mean(values) -> float:
    return float(values.mean()) if values.size else float("nan")


def _samples(data: dict, manifest: dict, learns_each_task: bool) -> dict:
    """The samples the summaries read (masks over `data`'s rows; the MI of the forgotten and kept)."""
    import numpy as np

    last = manifest["n_tasks"] - 1
    # A method that learns at the last task only (JOINT): an earlier task's own model is the untrained
    # network, whose right guesses are no "learned" samples and whose MI scores nothing (NaN).
    trained = np.ones(len(data["task"]), bool) if learns_each_task else data["task"] == last
    train = data["split"] == "train"
    # The last task's own model is the final one: its samples cannot be forgotten, and counted as
    # kept they would pull the rate down and the kept MI towards the newest (tail) classes.
    learned = train & data["correct_own"] & (data["task"] < last) & trained
    # A method without an MC-dropout score has NaN MI: its histograms are empty.
    scored = ~np.isnan(data["mi"])
    return {"trained": trained, "train": train, "learned": learned, "scored": scored,
            "forgotten": data["mi"][learned & data["forgotten"] & scored],
            "kept": data["mi"][learned & ~data["forgotten"] & scored]}


def summary_of(data: dict, manifest: dict, learns_each_task: bool = True) -> dict:
    """The summary metrics of the scores `data` (scores.parquet's columns)."""
    s = _samples(data, manifest, learns_each_task)
    return {"score.mean_mi": _mean(data["mi"][s["train"] & s["trained"]]),
            "score.forgotten_rate": _rate(data["forgotten"][s["learned"]]),
            "score.mi_forgotten": _mean(s["forgotten"]), "score.mi_kept": _mean(s["kept"])}


def _summaries(data: dict, manifest: dict, learns_each_task: bool = True) -> dict:
    """The paper's motivation from the scores: per class (minority classes more uncertain), and
    forgotten against kept samples by MI; CSVs and plots under reports/score/, summary metrics."""
    import numpy as np

    counts = manifest["train_counts"]
    s = _samples(data, manifest, learns_each_task)
    trained, train, learned, scored, forgotten, kept = (
        s[k] for k in ("trained", "train", "learned", "scored", "forgotten", "kept"))
    by_class = []
    for pos, c in enumerate(manifest["class_order"]):
        m = train & (data["label"] == c)
        by_class.append({"position": pos, "label": c, "class": manifest["class_names"][c],
                         "task": int(data["task"][m][0]) if m.any() else -1, "count": counts[c],
                         "mean_mi": _mean(data["mi"][m & trained]), "mean_entropy": _mean(data["entropy"][m & trained]),
                         "mean_mi_final": _mean(data["mi_final"][m]),
                         "forgotten_rate": _rate(data["forgotten"][m & learned])})
    # reports/score (this stage's alone) is written whole in a temporary folder that replaces it in one
    # rename, as evaluate's reports/eval: killed midway, new CSVs stood beside the old plots.
    with artifacts.atomic_dir(paths.SCORE_REPORTS) as out:
        artifacts.write_csv(out / "by_class.csv", by_class)
        edges = np.linspace(0, max(float(data["mi"][train & scored].max()) if (train & scored).any() else 0.0, 1e-6), 21)
        hf = np.histogram(forgotten, edges)[0]
        hk = np.histogram(kept, edges)[0]
        artifacts.write_csv(out / "mi_forgotten_vs_kept.csv", [
            {"mi": round(float((edges[i] + edges[i + 1]) / 2), 6),
             "forgotten": round(float(hf[i] / max(hf.sum(), 1)), 6), "kept": round(float(hk[i] / max(hk.sum(), 1)), 6)}
            for i in range(len(hf))])
        # The own-task model's softmax spans the classes seen by then, so a later (in the ordered stream,
        # smaller) class's MI is over more classes; the final model's spans every class alike.
        plots.scatter([r["count"] for r in by_class], {
            "own-task model (softmax over the classes seen by then)": [r["mean_mi"] for r in by_class],
            "final model (softmax over every class)": [r["mean_mi_final"] for r in by_class]},
            "training images of the class", "mean MI", "Uncertainty against class frequency",
            out / "uncertainty_vs_frequency.png")
        plots.histograms({"forgotten": forgotten.tolist(), "kept": kept.tolist()}, "MI (own-task model)",
                         "Forgotten vs kept training samples", out / "forgotten_vs_kept.png", bins=edges)
    return summary_of(data, manifest, learns_each_task)
