"""`pbr evaluate`'s numbers from a hand-made accuracy record (no training: the models, buffers and
plots stood in for): metrics.json, the matrices' CSVs, the accuracy curve, the final rows, what is
logged per task, and when the scores are this training's."""

import csv
import hashlib
import json
import math

import pytest

# R[j][i]: task i after task j (None above the diagonal: not evaluated, as training writes it).
CLASS_IL = [[90.0, None, None], [40.0, 80.0, None], [30.0, 50.0, 70.0]]
TASK_IL = [[95.0, None, None], [85.0, 90.0, None], [80.0, 75.0, 85.0]]
MANIFEST = {"n_tasks": 3, "n_classes": 6, "task_train_counts": [100, 30, 10],
            "class_names": [f"c{c}" for c in range(6)], "task_classes": [[0, 1], [2, 3], [4, 5]]}


class Tracker:
    def __init__(self):
        self.joined = {"pbr.stage.prepare": "done", "pbr.stage.score": "done"}
        self.logged = []

    def log_once(self, key, steps):
        self.logged = steps

    def log_artifact(self, *a):
        pass

    def log_new_params(self, *a):
        pass

    def set_tags(self, *a):
        pass


@pytest.fixture
def evaluate_with(tmp_path, monkeypatch):
    """Run the stage on the hand-made record of `method`; returns (result, tracker, bar plots drawn)."""
    import pbr.data.shards
    from stages.pipeline import evaluate
    from stages.runtime import plots

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DVC_STAGE", raising=False)
    monkeypatch.setattr(pbr.data.shards, "load_manifest", lambda path: MANIFEST)
    monkeypatch.setattr(evaluate, "check_trained", lambda cfg, manifest: None)
    # Each task's norms and buffer counts say which task they are: task k's are k + class / 10 and k + 1.
    monkeypatch.setattr(evaluate, "_head_norms", lambda path, manifest: [int(path.parent.name[-2:]) + c / 10
                                                                         for c in range(6)])
    monkeypatch.setattr(evaluate, "keeps_buffer", lambda tasks: True)
    monkeypatch.setattr(evaluate, "_buffer_hist", lambda path, n, has: [int(path.parent.name[-2:]) + 1] * n)
    monkeypatch.setattr(evaluate, "let_the_resume_store_go", lambda: None)
    monkeypatch.setattr(evaluate, "saved_run_params", lambda: {})
    monkeypatch.setattr(evaluate, "saved_run_tags", lambda: {})
    bars = []
    monkeypatch.setattr(plots, "heatmaps", lambda *a, **k: None)
    monkeypatch.setattr(plots, "task_curves", lambda *a, **k: None)
    monkeypatch.setattr(plots, "bars_by_task", lambda values, *a, **k: bars.append(values))

    def run(method):
        (tmp_path / "artifacts/train").mkdir(parents=True, exist_ok=True)
        (tmp_path / "artifacts/train/accuracy.json").write_text(json.dumps(
            {"settings": {"method": method}, "class_il": {"matrix": CLASS_IL}, "task_il": {"matrix": TASK_IL}}))
        tracker = Tracker()
        result = evaluate.run(None, log=lambda *_: None, tracker=tracker)
        return result, tracker, bars

    return run


def _csv(name):
    with open(f"reports/eval/{name}") as f:
        return list(csv.DictReader(f))


def test_metrics_json_by_hand(evaluate_with):
    """Class-IL: ACC (30+50+70)/3 = 50; BWT ((30-90)+(50-80))/2 = -45; forgetting ((90-30)+(80-50))/2
    = 45; the minority tasks are the smaller half by training size, tasks 1 and 2 (30 and 10
    images): (50+70)/2 = 60. Task-IL: 80, -15, 15, 80. The final row is the one after the last task."""
    evaluate_with("er")
    got = json.loads(open("reports/metrics.json").read())
    assert got == {"class_il": {"acc": 50.0, "bwt": -45.0, "forgetting": 45.0, "minority_acc": 60.0,
                                "final_per_task": [30.0, 50.0, 70.0]},
                   "task_il": {"acc": 80.0, "bwt": -15.0, "forgetting": 15.0, "minority_acc": 80.0,
                               "final_per_task": [80.0, 75.0, 85.0]}}


def test_the_matrix_csv_has_a_row_per_task_learned_and_nan_where_a_task_was_not_yet_seen(evaluate_with):
    evaluate_with("er")
    rows = _csv("class_il_matrix.csv")
    assert [r["after_task"] for r in rows] == ["0", "1", "2"]
    assert [r["task_0"] for r in rows] == ["90.0", "40.0", "30.0"]  # task 0 forgotten, read down its column
    assert [r["task_2"] for r in rows] == ["nan", "nan", "70.0"]
    assert rows[1] == {"after_task": "1", "task_0": "40.0", "task_1": "80.0", "task_2": "nan"}


def test_the_accuracy_curve_is_the_mean_over_the_tasks_seen(evaluate_with):
    """After task 0: 90; after 1: (40+80)/2 = 60; after 2: 50 (Task-IL 95, 87.5, 80)."""
    evaluate_with("er")
    assert [(float(r["class_il"]), float(r["task_il"])) for r in _csv("accuracy_curve.csv")] == \
        [(90.0, 95.0), (60.0, 87.5), (50.0, 80.0)]


def test_a_method_learning_at_the_last_task_only_has_no_bwt_and_no_curve_before_it(evaluate_with):
    """JOINT's earlier rows are an untrained network's: no BWT or forgetting, NaN in the curve."""
    result, _, _ = evaluate_with("joint")
    got = json.loads(open("reports/metrics.json").read())
    assert set(got["class_il"]) == {"acc", "minority_acc", "final_per_task"} and got["class_il"]["acc"] == 50.0
    curve = _csv("accuracy_curve.csv")
    assert [r["class_il"] for r in curve[:2]] == ["nan", "nan"] and float(curve[2]["class_il"]) == 50.0


def test_the_final_weight_norms_and_buffer_are_the_last_tasks(evaluate_with):
    evaluate_with("er")
    assert [float(r["norm"]) for r in _csv("weight_norms_final.csv")] == pytest.approx([2.0, 2.1, 2.2, 2.3, 2.4, 2.5])
    assert {r["count"] for r in _csv("buffer_final.csv")} == {"3"}
    norms = _csv("weight_norms.csv")
    assert [(r["after_task"], r["class"], float(r["norm"])) for r in norms[:2]] == [("0", "0", 0.0), ("0", "1", 0.1)]
    assert len(norms) == 18 and (norms[-1]["after_task"], float(norms[-1]["norm"])) == ("2", 2.5)


def test_the_norm_plot_shows_the_classes_seen_so_far_only(evaluate_with):
    _, _, bars = evaluate_with("er")
    norms = bars[0]  # the weight norms' plot, then the buffer's
    assert [[not math.isnan(v) for v in row] for row in norms] == [
        [True, True, False, False, False, False], [True] * 4 + [False] * 2, [True] * 6]


def test_each_tasks_final_accuracy_is_logged_at_its_own_step(evaluate_with):
    _, tracker, _ = evaluate_with("er")
    (step0, flat), *per_task = tracker.logged
    assert step0 == 0 and flat["class_il.acc"] == 50.0 and flat["task_il.minority_acc"] == 80.0
    assert per_task == [(0, {"class_il.final_task_acc": 30.0, "task_il.final_task_acc": 80.0}),
                        (1, {"class_il.final_task_acc": 50.0, "task_il.final_task_acc": 75.0}),
                        (2, {"class_il.final_task_acc": 70.0, "task_il.final_task_acc": 85.0})]


# ----------------------------------------------------------------- scored_this_training

def _scored_project(root):
    """A dvc.lock whose score entry read the prepared data and trained run `linked` names, with
    params.yaml's score params, and names artifacts/score as it is (DVC's listing of the folder in the
    cache holds the md5 of the scores file there)."""
    import yaml

    scores = root / "artifacts/score/scores.parquet"
    scores.parent.mkdir(parents=True)
    scores.write_bytes(b"scores")
    listing_md5 = "ab" + "c" * 30
    listing = root / ".dvc/cache/files/md5/ab" / ("c" * 30 + ".dir")
    listing.parent.mkdir(parents=True)
    listing.write_text(json.dumps([{"relpath": "scores.parquet", "md5": hashlib.md5(b"scores").hexdigest()}]))
    linked = {"dvc.md5.data/prepared": "1" * 32 + ".dir", "dvc.md5.artifacts/train": "2" * 32 + ".dir"}
    lock = {"schema": "2.0", "stages": {"score": {
        "cmd": "pbr score",
        "deps": [{"path": "data/prepared", "md5": linked["dvc.md5.data/prepared"]},
                 {"path": "artifacts/train", "md5": linked["dvc.md5.artifacts/train"]}],
        "params": {"params.yaml": {"seed": 0, "score": {"temperature": 1.0}, "train.eval_batch_size": 256}},
        "outs": [{"path": "artifacts/score", "md5": listing_md5 + ".dir"}]}}}
    (root / "dvc.lock").write_text(yaml.safe_dump(lock))
    params = {"seed": 0, "score": {"temperature": 1.0}, "train": {"eval_batch_size": 256, "epochs": 50}}
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    return linked, params


def test_the_scores_are_this_trainings_while_the_lock_says_so_and_not_after_any_change(tmp_path):
    import yaml

    from stages.pipeline.evaluate import scored_this_training

    linked, params = _scored_project(tmp_path)
    lock, now = tmp_path / "dvc.lock", tmp_path / "params.yaml"
    assert scored_this_training(linked, lock, now)
    assert not scored_this_training({}, lock, now)  # not under DVC: nothing links the run
    for key in linked:  # another prepared data set or another training than the one scored
        assert not scored_this_training({**linked, key: "9" * 32 + ".dir"}, lock, now), key
    edited = tmp_path / "edited" / "params.yaml"  # the lock's entry is params.yaml's
    edited.parent.mkdir()
    for section, key in (("score", "temperature"), ("train", "eval_batch_size")):  # a score param edited since
        changed = json.loads(json.dumps(params))
        changed[section][key] = 7
        edited.write_text(yaml.safe_dump(changed))
        assert not scored_this_training(linked, lock, edited), key
    # A train param score does not read changes nothing.
    edited.write_text(yaml.safe_dump({**params, "train": {**params["train"], "epochs": 5}}))
    assert scored_this_training(linked, lock, edited)
    (tmp_path / "artifacts/score/scores.parquet").write_bytes(b"other")  # not the scores the lock names
    assert not scored_this_training(linked, lock, now)
