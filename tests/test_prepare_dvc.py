"""`dvc repro prepare` end to end on generated data in each real format; the real CIFAR-10 through the stage."""

import csv
import json
import signal
import subprocess

import pytest

import fakedata
from conftest import REAL_CIFAR10, real_cifar10
from project import BIN, dvc, env, make_project, set_params, tree_bytes

# The prepare stage's record is not the subject here (conftest's records_to_files).
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("records_to_files")]


def _manifest(repo):
    return json.loads((repo / "data/prepared/manifest.json").read_text())


def _check_counts(repo, n_max, n_classes, ir, n_tasks):
    m = _manifest(repo)
    from pbr.data.longtail import class_counts

    assert m["train_counts"] == class_counts(n_max, n_classes, ir).tolist()
    assert len(m["task_classes"]) == n_tasks and sum(m["task_train_counts"]) == sum(m["train_counts"])
    rows = list(csv.DictReader(open(repo / "reports/prepare/class_counts.csv")))
    assert [int(r["train_count"]) for r in rows] == [m["train_counts"][c] for c in m["class_order"]]


def test_dvc_repro_prepare_and_replaced_raw_data_never_comes_back_from_dvcs_run_cache(tmp_path):
    """`dvc repro prepare`: counts, nothing run when nothing changed, the declared plots, a changed
    parameter run again. Then the documented steps after replacing the raw data: `dvc repro -f -s
    prepare` alone rebuilt the current setting, and a setting run before was then restored by DVC's run
    cache (params only) built from the old archive, and trained on; the run cache is cleared first now.
    (One project for both: a `dvc repro` costs about 5 CPU s of imports on CI's two cores.)"""
    import shutil

    raw = tmp_path / "raw"
    fakedata.write_cifar(raw, 10, 100, 3, form="archive")
    repo = make_project(tmp_path / "repo", data__root=str(raw), data__download=False, data__imbalance_ratio=0.01,
                        data__n_tasks=5)
    dvc(repo, "repro", "prepare")
    _check_counts(repo, 100, 10, 0.01, 5)
    assert (repo / "dvc.lock").is_file()
    # Nothing changed: nothing runs.
    assert "didn't change" in dvc(repo, "repro", "prepare").stdout
    # The declared plots render.
    dvc(repo, "plots", "show", "-o", str(tmp_path / "plots"))
    assert (tmp_path / "plots" / "index.html").is_file()
    # A changed parameter re-runs the stage.
    set_params(repo, data__setting="shuffled")
    assert "Running stage 'prepare'" in dvc(repo, "repro", "prepare").stdout
    assert _manifest(repo)["class_order"] != list(range(10))

    set_params(repo, data__imbalance_ratio=0.1)
    dvc(repo, "repro", "prepare")
    old = _manifest(repo)["raw"]["content_sha256"]
    fakedata.write_cifar(raw, 10, 150, 3, form="archive")  # the raw data replaced
    shutil.rmtree(repo / ".dvc/cache/runs")  # the docs' first step (the second, a forced prepare, changes nothing here)
    set_params(repo, data__imbalance_ratio=0.01)  # a setting run before the replacement (shuffled, IR 0.01)
    said = dvc(repo, "repro", "prepare").stdout
    assert "is cached" not in said and _manifest(repo)["raw"]["content_sha256"] != old, said
    assert max(_manifest(repo)["train_counts"]) == 150


@pytest.mark.parametrize("dataset,form,ir,n_tasks", [
    ("cifar100", "folder", 0.1, 10),
    ("tinyimagenet", "zip", 0.1, 10),
])
def test_prepare_reads_every_format(tmp_path, monkeypatch, dataset, form, ir, n_tasks):
    """The other datasets in their other real formats, through the prepare stage in this process: what
    DVC does with the stage (above) does not depend on the data's format."""
    from stages.pipeline import prepare
    from stages.runtime.config import from_dict

    raw = tmp_path / "raw"
    if dataset == "tinyimagenet":
        fakedata.write_tinyimagenet(raw, 10, 1, form=form)
        n_max, n_classes = 10, 200
    else:
        n_max, n_classes = 20, 100
        fakedata.write_cifar(raw, n_classes, n_max, 3, form=form)
    monkeypatch.chdir(tmp_path)
    prepare.run(from_dict({"data": {"dataset": dataset, "root": str(raw), "download": False, "imbalance_ratio": ir,
                                    "n_tasks": n_tasks}}), log=lambda *_: None)
    _check_counts(tmp_path, n_max, n_classes, ir, n_tasks)


def test_missing_raw_data_fails_cleanly_through_dvc(tmp_path):
    repo = make_project(tmp_path / "repo", data__root=str(tmp_path / "empty"), data__download=False)
    r = dvc(repo, "repro", "prepare", check=False)
    assert r.returncode != 0
    assert "error: no cifar10 data in" in r.stderr + r.stdout
    assert not (repo / "data/prepared").exists()


@real_cifar10
def test_prepare_real_cifar10(tmp_path, monkeypatch):
    """The real archive through the prepare stage, in this process (the stage under `dvc repro` is
    checked above on generated archives of the same format)."""
    import yaml

    from conftest import ROOT
    from stages.pipeline import prepare
    from stages.runtime.config import from_dict

    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["data"].update(root=str(REAL_CIFAR10.parent), download=False)
    monkeypatch.chdir(tmp_path)
    prepare.run(from_dict(raw), log=lambda *_: None)
    repo = tmp_path
    m = _manifest(repo)
    assert m["task_train_counts"] == [7997, 2873, 1032, 371, 133]
    assert m["task_test_counts"] == [2000] * 5
    assert m["class_names"][:2] == ["airplane", "automobile"]
    from pbr.data.shards import read_split

    s = read_split(repo / "data/prepared", m, 4, "train")
    assert s.images.shape == (133, 32, 32, 3) and sorted(set(s.labels.tolist())) == [8, 9]


def test_killed_prepare_leaves_the_previous_output_untouched(tmp_path, monkeypatch):
    """`pbr prepare` SIGKILLed with its new shards written but not renamed into place (PBR_KILL_AT,
    stages/runtime/faults.py): the previous complete output is untouched, the partial one is not under
    data/prepared, and the next prepare finishes and clears it. The preparing around the killed one
    runs in this process (test_faults_dvc kills prepare under `dvc repro` too)."""
    from stages.pipeline import prepare
    from stages.runtime.config import load_config

    raw = tmp_path / "raw"
    fakedata.write_cifar(raw, 10, 60, 6)
    repo = make_project(tmp_path / "repo", data__root=str(raw), data__download=False, data__imbalance_ratio=0.5)
    monkeypatch.chdir(repo)
    prepare.run(load_config(repo / "params.yaml"), log=lambda *_: None)
    old, old_shards = _manifest(repo), tree_bytes(repo / "data/prepared")
    set_params(repo, data__imbalance_ratio=0.1)
    r = subprocess.run([str(BIN / "pbr"), "prepare"], cwd=repo, env={**env(), "PBR_KILL_AT": "prepare:written"},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    assert _manifest(repo) == old and tree_bytes(repo / "data/prepared") == old_shards
    assert list((repo / "data").glob(".prepared.tmp-*/task_00"))  # the new shards, under a temporary name
    prepare.run(load_config(repo / "params.yaml"), log=lambda *_: None)
    assert _manifest(repo)["params"]["imbalance_ratio"] == 0.1
    assert not list((repo / "data").glob(".prepared.*"))
