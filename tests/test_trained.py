"""The stages ask the trained method, rebuilt from its saved task (stages/pipeline/trained.py), what they
used to dig out of state dicts: its classifier's norms and what MC dropout samples."""

import csv
import json
import os

import pytest
import torch

import fakedata
from stages.runtime.config import from_dict


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A PBR and a PNN run, trained and evaluated once on tiny generated data."""
    from stages.pipeline import evaluate, prepare, train

    out = {}
    for name in ("pbr", "pnn"):
        root = tmp_path_factory.mktemp(name)
        fakedata.write_cifar(root / "raw", 10, 30, 4)
        cfg = from_dict({"data": {"root": str(root / "raw"), "download": False, "imbalance_ratio": 0.2},
                         "model": {"width": 4}, "method": {"name": name, "pbr": {"mc_samples": 3}, "buffer_size": 20},
                         "train": {"epochs": 1, "device": "cpu", "precision": "fp32", "threads": 1}})
        cwd = os.getcwd()
        os.chdir(root)
        try:
            prepare.run(cfg, log=lambda *_: None)
            train.run(cfg, log=lambda *_: None)
            evaluate.run(cfg, log=lambda *_: None)
        finally:
            os.chdir(cwd)
        out[name] = root
    return out


def _norms_csv(root):
    with open(root / "reports/eval/weight_norms.csv") as f:
        rows = list(csv.DictReader(f))
    by_task = {}
    for r in rows:
        by_task.setdefault(int(r["after_task"]), []).append(float(r["norm"]))
    return by_task


@pytest.mark.parametrize("name", ["pbr", "pnn"])
def test_weight_norms_are_the_classifier_the_method_predicts_with(runs, name):
    """Hand rule from the saved weights: the head's rows for a single-head net; for PNN the newest
    column's classifier (column k after task k), never a lateral classifier."""
    by_task = _norms_csv(runs[name])
    for k, norms in by_task.items():
        state = torch.load(runs[name] / f"artifacts/train/task_{k:02d}/model.pt", weights_only=False)["state_dict"]
        key = "head.weight" if name == "pbr" else f"columns.{k}.classifier.weight"
        want = [round(float(torch.linalg.vector_norm(row)), 6) for row in state[key]]
        assert norms == pytest.approx(want, abs=2e-6), (name, k)
    assert len(by_task) == 5
    # DVC's bar plot of the final norms sorts its axis as text: in label order only when padded.
    with open(runs[name] / "reports/eval/weight_norms_final.csv") as f:
        final = list(csv.DictReader(f))
    assert sorted(r["class"] for r in final) == [r["class"] for r in final]
    names = json.loads((runs[name] / "data/prepared/manifest.json").read_text())["class_names"]
    assert [r["class"].split(" ", 1)[1] for r in final] == names  # the bars read by class name
    assert [float(r["norm"]) for r in final] == by_task[4]


def test_a_method_without_a_single_head_is_not_mc_scored(runs):
    from stages.pipeline.trained import load_method
    from pbr.data.shards import load_manifest

    manifest = load_manifest(runs["pnn"] / "data/prepared")
    pnn, _ = load_method(runs["pnn"] / "artifacts/train/task_04/model.pt", manifest, torch.device("cpu"),
                         torch.Generator())
    pbr, _ = load_method(runs["pbr"] / "artifacts/train/task_04/model.pt", manifest, torch.device("cpu"),
                         torch.Generator())
    assert pnn.mc_network() is None and pbr.mc_network() is pbr.net
