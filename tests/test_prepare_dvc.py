"""`dvc repro prepare` end to end, on generated data in each real format and on the real CIFAR-10."""

import csv
import json
import os
import signal
import subprocess
import time

import pytest

import fakedata
from conftest import REAL_CIFAR10, real_cifar10
from project import BIN, dvc, env, make_project, run, set_params

pytestmark = pytest.mark.slow


def _manifest(repo):
    return json.loads((repo / "data/prepared/manifest.json").read_text())


@pytest.mark.parametrize("dataset,form,ir,n_tasks", [
    ("cifar10", "archive", 0.01, 5),
    ("cifar100", "folder", 0.1, 10),
    ("tinyimagenet", "zip", 0.1, 10),
])
def test_dvc_repro_prepare(tmp_path, dataset, form, ir, n_tasks):
    raw = tmp_path / "raw"
    if dataset == "tinyimagenet":
        fakedata.write_tinyimagenet(raw, 10, 1, form=form)
        n_max, n_classes = 10, 200
    else:
        n_classes = 10 if dataset == "cifar10" else 100
        n_max = 100 if dataset == "cifar10" else 20
        fakedata.write_cifar(raw, n_classes, n_max, 3, form=form)
    repo = make_project(tmp_path / "repo", data__dataset=dataset, data__root=str(raw), data__download=False,
                        data__imbalance_ratio=ir, data__n_tasks=n_tasks)
    dvc(repo, "repro", "prepare")
    m = _manifest(repo)
    from pbr.data.longtail import class_counts

    assert m["train_counts"] == class_counts(n_max, n_classes, ir).tolist()
    assert len(m["task_classes"]) == n_tasks and sum(m["task_train_counts"]) == sum(m["train_counts"])
    assert (repo / "dvc.lock").is_file()
    rows = list(csv.DictReader(open(repo / "reports/prepare/class_counts.csv")))
    assert [int(r["train_count"]) for r in rows] == [m["train_counts"][c] for c in m["class_order"]]
    # Nothing changed: nothing runs.
    assert "didn't change" in dvc(repo, "repro", "prepare").stdout
    # The declared plots render.
    dvc(repo, "plots", "show", "-o", str(tmp_path / "plots"))
    assert (tmp_path / "plots" / "index.html").is_file()
    # A changed parameter re-runs the stage.
    set_params(repo, data__setting="shuffled")
    assert "Running stage 'prepare'" in dvc(repo, "repro", "prepare").stdout
    assert _manifest(repo)["class_order"] != list(range(n_classes))


def test_missing_raw_data_fails_cleanly_through_dvc(tmp_path):
    repo = make_project(tmp_path / "repo", data__root=str(tmp_path / "empty"), data__download=False)
    r = dvc(repo, "repro", "prepare", check=False)
    assert r.returncode != 0
    assert "error: no cifar10 data in" in r.stderr + r.stdout
    assert not (repo / "data/prepared").exists()


@real_cifar10
def test_dvc_repro_prepare_real_cifar10(tmp_path):
    repo = make_project(tmp_path / "repo", data__root=str(REAL_CIFAR10.parent), data__download=False)
    dvc(repo, "repro", "prepare")
    m = _manifest(repo)
    assert m["task_train_counts"] == [7997, 2873, 1032, 371, 133]
    assert m["task_test_counts"] == [2000] * 5
    assert m["class_names"][:2] == ["airplane", "automobile"]
    from pbr.data.shards import read_split

    s = read_split(repo / "data/prepared", m, 4, "train")
    assert s.images.shape == (133, 32, 32, 3) and sorted(set(s.labels.tolist())) == [8, 9]


@real_cifar10
def test_killed_prepare_leaves_nothing_that_looks_complete(tmp_path):
    repo = make_project(tmp_path / "repo", data__root=str(REAL_CIFAR10.parent), data__download=False)
    run([str(BIN / "pbr"), "prepare"], repo)
    old = _manifest(repo)
    set_params(repo, data__imbalance_ratio=0.1)
    p = subprocess.Popen([str(BIN / "pbr"), "prepare"], cwd=repo, env=env(), stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline and not list((repo / "data").glob(".prepared.tmp-*/task_00")):
        time.sleep(0.01)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    # The previous complete output is untouched; the partial one is not under data/prepared.
    assert _manifest(repo) == old
    run([str(BIN / "pbr"), "prepare"], repo)
    assert _manifest(repo)["params"]["imbalance_ratio"] == 0.1
    assert not list((repo / "data").glob(".prepared.*"))
