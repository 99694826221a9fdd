"""Prepared tasks as parquet shards plus a manifest that names and hashes every shard.

One row per image: `image` (fixed-size binary, uint8 HWC bytes), `label`, `index` (position in
the raw split), `task`. Reading a split concatenates the image column's single data buffer into
one uint8 array: no per-sample Python.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pbr.data.longtail import Stream
from pbr.data.sources import RawDataset
from pbr.errors import DataError

MANIFEST = "manifest.json"
FORMAT = 1


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def image_column(images: np.ndarray) -> pa.FixedSizeBinaryArray:
    """uint8 [N, H, W, C] as one fixed-size binary column over a single data buffer."""
    n, width = len(images), int(np.prod(images.shape[1:]))
    flat = pa.py_buffer(np.ascontiguousarray(images).reshape(-1))
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), n, [None, flat])


def _table(images: np.ndarray, labels: np.ndarray, indices: np.ndarray, task: int) -> pa.Table:
    n = len(images)
    return pa.table({
        "image": image_column(images),
        "label": pa.array(labels.astype(np.int16)),
        "index": pa.array(indices.astype(np.int32)),
        "task": pa.array(np.full(n, task, dtype=np.int16)),
    })


def _write_split(out: Path, task: int, split: str, images, labels, indices, rows_per_shard: int) -> list[dict]:
    shards = []
    starts = range(0, max(len(images), 1), rows_per_shard)
    for k, s in enumerate(starts):
        rel = f"task_{task:02d}/{split}-{k:03d}.parquet"
        sink = pa.BufferOutputStream()
        sl = slice(s, s + rows_per_shard)
        pq.write_table(_table(images[sl], labels[sl], indices[sl], task), sink, compression="none",
                       row_group_size=rows_per_shard)
        blob = sink.getvalue().to_pybytes()
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(blob)
        shards.append({"path": rel, "task": task, "split": split, "rows": len(images[sl]), "sha256": _sha256(blob)})
    return shards


def write_prepared(out: Path, raw: RawDataset, stream: Stream, params: dict, shard_mb: float) -> dict:
    """Write every task's shards and, last, the manifest into `out` (a fresh folder)."""
    out = Path(out)
    bytes_per_row = int(np.prod(raw.image_shape)) + 8
    rows_per_shard = max(1, int(shard_mb * 2**20) // bytes_per_row)
    shards: list[dict] = []
    for t in range(stream.n_tasks):
        for split, idx, x, y in (("train", stream.train_indices[t], raw.train_images, raw.train_labels),
                                 ("test", stream.test_indices[t], raw.test_images, raw.test_labels)):
            shards += _write_split(out, t, split, x[idx], y[idx], idx, rows_per_shard)
    test_counts = np.bincount(raw.test_labels, minlength=raw.n_classes)
    manifest = {
        "format": FORMAT,
        "dataset": raw.name,
        "image_shape": list(raw.image_shape),
        "n_classes": raw.n_classes,
        "n_tasks": stream.n_tasks,
        "class_names": raw.class_names,
        "class_order": stream.class_order.tolist(),
        "task_classes": [c.tolist() for c in stream.task_classes],
        "train_counts": stream.counts.tolist(),
        "test_counts": test_counts.tolist(),
        "task_train_counts": [len(i) for i in stream.train_indices],
        "task_test_counts": [len(i) for i in stream.test_indices],
        "params": params,
        # The content's hash, not where or in which form (archive or extracted folder) it was read.
        "raw": {"content_sha256": raw.content_hash()},
        "shards": shards,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


# What write_prepared records, every key of which the stages read.
_KEYS = ("dataset", "image_shape", "n_classes", "n_tasks", "class_names", "class_order", "task_classes",
         "train_counts", "test_counts", "task_train_counts", "task_test_counts", "params", "raw", "shards")


def load_manifest(prepared: Path) -> dict:
    path = Path(prepared) / MANIFEST
    if not path.is_file():
        raise DataError(f"{path} is missing: the prepared data is absent or incomplete; run `dvc repro prepare`")
    try:
        manifest = json.loads(path.read_text())
    except ValueError:
        raise DataError(f"{path} is not valid JSON; run `dvc repro prepare` again") from None
    if not isinstance(manifest, dict):
        raise DataError(f"{path} is not a manifest (a JSON object); run `dvc repro prepare` again")
    if manifest.get("format") != FORMAT:
        raise DataError(f"{path}: manifest format {manifest.get('format')} is not {FORMAT}; run `dvc repro prepare`")
    missing = [k for k in _KEYS if k not in manifest]
    if missing:
        raise DataError(f"{path} lacks {', '.join(missing)}: it is damaged; run `dvc repro prepare` again")
    return manifest


def manifest_hash(prepared: Path) -> str:
    return _sha256((Path(prepared) / MANIFEST).read_bytes())


@dataclass
class Split:
    images: np.ndarray  # uint8 [N, H, W, 3]
    labels: np.ndarray  # int64 [N]
    indices: np.ndarray  # int64 [N], position in the raw split


def read_split(prepared: Path, manifest: dict, task: int, split: str, verify: bool = True) -> Split:
    """One task's split as contiguous arrays; each shard's bytes are checked against the manifest."""
    prepared = Path(prepared)
    shape = tuple(manifest["image_shape"])
    width = int(np.prod(shape))
    chosen = [s for s in manifest["shards"] if s["task"] == task and s["split"] == split]
    if not chosen:
        raise DataError(f"{prepared}: no {split} shard for task {task} in the manifest "
                        f"(it has {manifest['n_tasks']} tasks)")
    images, labels, indices = [], [], []
    for s in chosen:
        path = prepared / s["path"]
        try:
            blob = path.read_bytes()
        except OSError:
            raise DataError(f"{path} is missing; run `dvc repro prepare` (or `dvc pull`)") from None
        if verify and _sha256(blob) != s["sha256"]:
            raise DataError(f"{path} does not match its hash in the manifest (corrupt or modified); "
                            f"run `dvc repro prepare` (or `dvc checkout --force`)")
        try:
            table = pq.read_table(pa.BufferReader(blob))
        except (pa.ArrowException, OSError) as e:
            raise DataError(f"{path}: unreadable parquet ({type(e).__name__}); run `dvc repro prepare`") from None
        if table.num_rows != s["rows"]:
            raise DataError(f"{path}: {table.num_rows} rows, the manifest says {s['rows']}; run `dvc repro prepare`")
        col = table.column("image").combine_chunks()
        # Fixed-size binary keeps all images in one data buffer: view it, no per-row work.
        buf = np.frombuffer(col.buffers()[1], dtype=np.uint8)
        images.append(buf[col.offset * width:(col.offset + len(col)) * width].reshape(-1, *shape))
        labels.append(table.column("label").to_numpy().astype(np.int64))
        indices.append(table.column("index").to_numpy().astype(np.int64))
    return Split(np.concatenate(images), np.concatenate(labels), np.concatenate(indices))
