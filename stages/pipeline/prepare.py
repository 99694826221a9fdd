"""`pbr prepare`: raw archive -> long-tailed tasks as parquet shards + manifest + count plots."""

from __future__ import annotations

import time

from pbr.errors import UserError
from stages.runtime import artifacts, faults, paths
from stages.runtime.config import Config


def count_tables(manifest: dict) -> tuple[list[dict], list[dict]]:
    task_of = {c: t for t, cls in enumerate(manifest["task_classes"]) for c in cls}
    per_class = [
        {"position": pos, "label": c, "class": f"{pos:03d} {manifest['class_names'][c]}", "task": task_of[c],
         "train_count": manifest["train_counts"][c], "test_count": manifest["test_counts"][c]}
        for pos, c in enumerate(manifest["class_order"])
    ]
    per_task = [
        {"task": f"{t:02d}", "train_count": manifest["task_train_counts"][t], "test_count": manifest["task_test_counts"][t]}
        for t in range(manifest["n_tasks"])
    ]
    return per_class, per_task


def record(manifest: dict, tracker) -> None:
    """The stage's record in the run: the data's hashes, each task's training count, the count tables.
    The evaluate stage records it too where DVC did not run this stage (its output cached)."""
    from pbr.data.shards import manifest_hash

    tracker.set_tags({"pbr.data_manifest": manifest_hash(paths.PREPARED),
                      "pbr.raw_sha256": manifest["raw"]["content_sha256"]})
    tracker.log_once("pbr.prepare.logged",
                     [(t, {"data.task_train_count": n}) for t, n in enumerate(manifest["task_train_counts"])])
    faults.point("prepare:logged")
    tables = dict(zip(("class_counts.csv", "task_counts.csv"), count_tables(manifest)))
    if all((paths.PREPARE_PLOTS / f).is_file() for f in tables):
        for f in tables:
            tracker.log_artifact(paths.PREPARE_PLOTS / f, "prepare")
        return
    # Not beside the data (an offline sweep's run links data/prepared only): the same tables from the
    # manifest, written apart, for the workspace's reports/prepare is the prepare stage's DVC output.
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        for f, rows in tables.items():
            artifacts.write_csv(Path(tmp) / f, rows)
            tracker.log_artifact(Path(tmp) / f, "prepare")


def check(cfg: Config) -> None:
    """What the stage refuses before it starts: data.root a file, no data there and no download."""
    from pbr.data.sources import check_raw

    check_raw(cfg.data.dataset, paths.from_repo(cfg.data.root), cfg.data.download)


def run(cfg: Config, log=print, tracker=None) -> dict:
    from pbr.data.longtail import build_stream
    from pbr.data.shards import write_prepared
    from pbr.data.sources import load_raw

    d = cfg.data
    t0 = time.perf_counter()
    raw = load_raw(d.dataset, paths.from_repo(d.root), d.download)
    log(f"read {raw.name} from {raw.source}: {len(raw.train_labels)} train / {len(raw.test_labels)} test images "
        f"({time.perf_counter() - t0:.1f}s)")
    try:
        stream = build_stream(raw.train_labels, raw.test_labels, raw.n_classes, d.setting, d.imbalance_ratio,
                              d.n_tasks, d.seed, raw.class_names, d.subset)
    except UserError as e:
        raise UserError(f"data.imbalance_ratio: {e}") from None
    with artifacts.atomic_dir(paths.PREPARED) as tmp:
        # Content only: where the archive lay and whether it could be fetched are no part of the
        # data, so one archive gives one data/prepared (one DVC hash, one manifest hash) on every machine
        # with the same pyarrow (each parquet footer names its writer's version).
        content = {k: v for k, v in cfg.to_dict()["data"].items() if k not in ("root", "download")}
        manifest = write_prepared(tmp, raw, stream, content, d.shard_mb)
        faults.point("prepare:written")
    per_class, per_task = count_tables(manifest)
    artifacts.write_csv(paths.PREPARE_PLOTS / "class_counts.csv", per_class)
    artifacts.write_csv(paths.PREPARE_PLOTS / "task_counts.csv", per_task)
    if tracker is not None:
        record(manifest, tracker)
    log(f"wrote {paths.PREPARED}: {stream.n_tasks} tasks, train sizes {manifest['task_train_counts']}, "
        f"{len(manifest['shards'])} shards ({time.perf_counter() - t0:.1f}s)")
    return manifest
