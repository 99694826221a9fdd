import numpy as np
import pytest

import fakedata
from pbr.data.longtail import build_stream
from pbr.data.shards import load_manifest, read_split, write_prepared
from pbr.data.sources import load_raw
from pbr.errors import DataError


@pytest.fixture
def raw(tmp_path):
    fakedata.write_cifar(tmp_path / "raw", 10, 60, 8)
    return load_raw("cifar10", tmp_path / "raw")


def _prepare(raw, out, shard_mb=64.0, ir=0.1):
    stream = build_stream(raw.train_labels, raw.test_labels, 10, "ordered", ir, 5, 1993)
    out.mkdir()
    return stream, write_prepared(out, raw, stream, {"imbalance_ratio": ir}, shard_mb)


def test_round_trip_gives_back_the_raw_images(raw, tmp_path):
    stream, manifest = _prepare(raw, tmp_path / "p")
    assert manifest["task_train_counts"] == [len(i) for i in stream.train_indices]
    for t in range(5):
        for split, idx, x, y in (("train", stream.train_indices[t], raw.train_images, raw.train_labels),
                                 ("test", stream.test_indices[t], raw.test_images, raw.test_labels)):
            s = read_split(tmp_path / "p", manifest, t, split)
            assert s.images.dtype == np.uint8 and s.images.shape == (len(idx), 32, 32, 3)
            assert np.array_equal(s.indices, idx)
            assert np.array_equal(s.images, x[idx]) and np.array_equal(s.labels, y[idx])


def test_shards_are_bounded_and_still_read_whole(raw, tmp_path):
    _, manifest = _prepare(raw, tmp_path / "p", shard_mb=0.05)  # ~17 rows per shard
    rows = [s["rows"] for s in manifest["shards"]]
    assert max(rows) <= 17 and len(manifest["shards"]) > 10
    s = read_split(tmp_path / "p", manifest, 0, "train")
    assert len(s.labels) == manifest["task_train_counts"][0]


def test_same_params_same_bytes(raw, tmp_path):
    _prepare(raw, tmp_path / "a")
    _prepare(raw, tmp_path / "b")
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert len(files) == 11
    for f in files:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f


def test_corrupt_shard_is_caught_by_the_manifest_hash(raw, tmp_path):
    _, manifest = _prepare(raw, tmp_path / "p")
    shard = tmp_path / "p" / "task_01" / "train-000.parquet"
    data = bytearray(shard.read_bytes())
    data[200] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(DataError, match="task_01/train-000.parquet does not match its hash"):
        read_split(tmp_path / "p", manifest, 1, "train")
    shard.unlink()
    with pytest.raises(DataError, match="train-000.parquet is missing"):
        read_split(tmp_path / "p", manifest, 1, "train")


def test_incomplete_folder_is_not_mistaken_for_prepared_data(tmp_path):
    (tmp_path / "p" / "task_00").mkdir(parents=True)
    with pytest.raises(DataError, match="manifest.json is missing"):
        load_manifest(tmp_path / "p")


def test_a_damaged_manifest_is_one_line_not_a_key_error(raw, tmp_path):
    """Valid JSON that is not the manifest write_prepared wrote: a KeyError or an AttributeError
    from deep inside a stage before."""
    import json

    _, manifest = _prepare(raw, tmp_path / "p")
    path = tmp_path / "p" / "manifest.json"
    for text, needle in (("[1, 2]", "is not a manifest"),
                         (json.dumps({"format": manifest["format"]}), "lacks dataset, image_shape"),
                         (json.dumps({k: v for k, v in manifest.items() if k != "shards"}), "lacks shards")):
        path.write_text(text)
        with pytest.raises(DataError, match=needle) as e:
            load_manifest(tmp_path / "p")
        assert "run `dvc repro prepare` again" in str(e.value)
