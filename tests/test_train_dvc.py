"""`dvc repro` of prepare + train on small generated data: every method, determinism, resume."""

import json
import os
import signal
import subprocess
import time

import pytest

import fakedata
from project import BIN, dvc, env, make_project, set_params

pytestmark = pytest.mark.slow

SMALL = dict(data__root=None, data__download=False, data__imbalance_ratio=0.1, model__width=4,
             train__epochs=1, train__device="cpu", train__eval_batch_size=256)


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    root = tmp_path_factory.mktemp("raw")
    fakedata.write_cifar(root, 10, 60, 6)
    return root


def _project(tmp_path, raw, **params):
    return make_project(tmp_path / "repo", **{**SMALL, "data__root": str(raw), **params})


def _accuracy(repo):
    return json.loads((repo / "artifacts/train/accuracy.json").read_text())


def test_every_method_trains_through_dvc(tmp_path, raw):
    repo = _project(tmp_path, raw)
    for name in ("sgd", "joint", "er", "der", "derpp", "pbr"):
        set_params(repo, method__name=name)
        dvc(repo, "repro", "train")
        acc = _accuracy(repo)
        assert acc["settings"]["method"] == name
        m = acc["class_il"]["matrix"]
        assert len(m) == 5 and all(len(r) == 5 for r in m)
        for k in range(5):
            task = repo / f"artifacts/train/task_{k:02d}"
            assert (task / "model.pt").is_file() and (task / "state.pt").is_file()
            assert (task / "buffer.parquet").is_file() == (name not in ("sgd", "joint"))
            assert all(v == 0 for v in m[k][k + 1:])  # Class-IL on unseen classes is 0
        assert 0 <= acc["class_il"]["acc"] <= 100 and 0 <= acc["task_il"]["acc"] <= 100
    import pyarrow.parquet as pq

    buf = pq.read_table(repo / "artifacts/train/task_04/buffer.parquet")
    assert buf.num_rows == 200 or buf.num_rows == sum(json.loads(
        (repo / "data/prepared/manifest.json").read_text())["task_train_counts"])
    assert set(buf.column_names) == {"image", "label", "task", "score", "logits"}
    assert "didn't change" in dvc(repo, "repro", "train").stdout


def test_same_seed_same_metrics_and_resume_after_sigkill(tmp_path, raw):
    repo = _project(tmp_path, raw, method__name="pbr", train__epochs=2)
    dvc(repo, "repro")
    first = _accuracy(repo)
    # Same seed, fresh artifacts: identical metrics.
    dvc(repo, "repro", "--force", "train")
    assert _accuracy(repo) == first  # --force on a persisted output with the same fingerprint resumes nothing new

    import shutil

    shutil.rmtree(repo / "artifacts/train")
    dvc(repo, "repro", "--force", "train")
    assert _accuracy(repo) == first

    # Kill `dvc repro` (and its `pbr train`) with SIGKILL in the middle of task 2.
    shutil.rmtree(repo / "artifacts/train")
    p = subprocess.Popen([str(BIN / "dvc"), "repro", "--force", "train"], cwd=repo, env=env(),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and not (repo / "artifacts/train/task_01/state.pt").exists():
        time.sleep(0.005)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    finished = sorted(x.name for x in (repo / "artifacts/train").glob("task_*"))
    assert "task_01" in finished and "task_04" not in finished, finished
    assert not (repo / "artifacts/train/accuracy.json").exists()
    r = dvc(repo, "repro")
    assert "resuming after task" in r.stdout + r.stderr
    assert _accuracy(repo) == first


def test_changed_settings_start_over(tmp_path, raw):
    repo = _project(tmp_path, raw, method__name="er")
    dvc(repo, "repro")
    set_params(repo, train__lr=0.05)
    r = dvc(repo, "repro")
    assert "starting over" in r.stdout + r.stderr
    assert _accuracy(repo)["settings"]["lr"] == 0.05


def test_cuda_requested_without_a_gpu_is_a_clear_error(tmp_path, raw):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    repo = _project(tmp_path, raw, train__device="cuda")
    r = dvc(repo, "repro", check=False)
    assert r.returncode != 0 and "train.device = cuda but no CUDA device is visible" in r.stdout + r.stderr
