"""The whole pipeline through `dvc repro` and MLflow tracking. A second configuration as a DVC experiment,
and the report comparing the two, are in test_methods_dvc (ER beside this PBR run) and test_add_method_dvc."""

import json

import pytest

from project import assert_links_this_execution, copy_project, dvc

pytestmark = pytest.mark.slow


def _client(repo):
    from mlflow import MlflowClient

    c = MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    return c, c.get_experiment_by_name("pbr").experiment_id


def test_pipeline_metrics_plots_and_mlflow_agree(tmp_path, finished):
    repo = copy_project(finished, tmp_path / "repo")
    metrics = json.loads((repo / "reports/metrics.json").read_text())
    acc = json.loads((repo / "artifacts/train/accuracy.json").read_text())
    last = acc["class_il"]["matrix"][-1]  # ACC: the final row's mean over the tasks
    assert metrics["class_il"]["acc"] == pytest.approx(sum(last) / len(last), abs=1e-4)
    for f in ("eval/class_il_matrix.csv", "eval/task_il_matrix.csv", "eval/matrices.png", "eval/weight_norms.png",
              "eval/buffer_histogram.png", "score/by_class.csv", "score/uncertainty_vs_frequency.png"):
        assert (repo / "reports" / f).stat().st_size > 0, f
    import pyarrow.parquet as pq

    scores = pq.read_table(repo / "artifacts/score/scores.parquet").to_pydict()
    assert {"mi", "entropy", "forgotten", "class_count", "task", "split"} <= set(scores)
    assert all(m >= 0 for m in scores["mi"])
    assert all(f == (o and not e) for f, o, e in zip(scores["forgotten"], scores["correct_own"],
                                                       scores["correct_final"]))
    # dvc metrics show reads the same numbers.
    shown = json.loads(dvc(repo, "metrics", "show", "--json").stdout)
    flat = json.dumps(shown)
    assert str(metrics["task_il"]["acc"]) in flat
    dvc(repo, "plots", "show", "-o", str(tmp_path / "plots"))
    assert (tmp_path / "plots" / "index.html").is_file()

    # One MLflow run for the whole execution, holding params, tags, metrics and artifacts.
    c, exp = _client(repo)
    # The kind MLflow 3's UI reads to open the experiment on its training runs, not its GenAI view.
    assert c.get_experiment(exp).tags.get("mlflow.experimentKind") == "custom_model_development"
    runs = c.search_runs([exp])
    assert len(runs) == 1
    r = runs[0]
    assert r.info.status == "FINISHED" and r.data.tags["pbr.complete"] == "true"
    assert all(r.data.tags[f"pbr.stage.{s}"] == "done" for s in ("prepare", "train", "score", "evaluate"))
    assert r.data.params["method.name"] == "pbr" and r.data.params["data.imbalance_ratio"] == "0.1"
    assert r.data.metrics["class_il.acc"] == pytest.approx(metrics["class_il"]["acc"], abs=1e-3)
    assert r.data.metrics["task_il.bwt"] == pytest.approx(metrics["task_il"]["bwt"], abs=1e-3)
    assert len(c.get_metric_history(r.info.run_id, "class_il.seen_acc")) == 5  # step = task
    assert len(c.get_metric_history(r.info.run_id, "train.loss")) == 10  # two epochs per task
    assert r.data.tags["dvc.md5.artifacts/train"].endswith(".dir")  # models and buffers: linked by hash
    assert_links_this_execution(r.data.tags, repo)
    assert len(r.data.tags["git.commit"]) == 40 and r.data.tags["pbr.data_manifest"]
    assert r.data.tags["mlflow.source.git.commit"] == r.data.tags["git.commit"]  # the UI's Version column
    # No NaN figure (this tiny run forgets every sample it learned: no kept MI to average); NaN is
    # left for imported and hand-logged runs (docs/report.md).
    import math

    assert "score.mean_mi" in r.data.metrics and all(math.isfinite(v) for v in r.data.metrics.values())
    # the code and the run it trained, by hash (git.dirty alone cannot say what a dirty tree ran)
    from stages.pipeline.train import code_hash

    run_json = json.loads((repo / "artifacts/train/run.json").read_text())
    assert r.data.tags["pbr.code_sha256"] == code_hash() == run_json["code_sha256"]
    assert r.data.tags["pbr.fingerprint"] == run_json["fingerprint"]
    # The resolved settings as params too (MLflow's parallel-coordinates and scatter charts read no tags):
    # PBR's auto head and dropout, the lr its preset gives, as the tags say them.
    resolved = {k: v for k, v in r.data.params.items() if k.startswith("resolved.")}
    assert resolved == {k: v for k, v in r.data.tags.items() if k.startswith("resolved.")}
    assert resolved["resolved.head"] == "cosine" and resolved["resolved.seed"] == "0"
    import hashlib  # the scores, which DVC keeps (no artifact), named by their hash

    assert r.data.tags["pbr.score_sha256"] == hashlib.sha256((repo / "artifacts/score/scores.parquet").read_bytes()).hexdigest()
    # what the score stage's auto settings resolved to: PBR's own T (method.pbr.mc_samples 4) and
    # rate (0.1), at its walk's temperature (a logit scale of 10: s cos / 1 under the tuned preset)
    assert (r.data.tags["score.resolved.mc_samples"], r.data.tags["score.resolved.dropout"]) == ("4", "0.1")
    arts = [a.path for a in c.list_artifacts(r.info.run_id, "evaluate")]
    assert "evaluate/metrics.json" in arts and "evaluate/matrices.png" in arts


def test_git_dirty_is_about_the_code_not_what_every_run_changes(tmp_path, monkeypatch):
    """Every run rewrites dvc.lock and the reports, `dvc exp run -S` params.yaml: git.dirty was true for
    nearly every run, so it said nothing. It covers the code."""
    import subprocess

    from stages.runtime import tracking

    monkeypatch.delenv("PBR_GIT_COMMIT", raising=False)
    for f in ("pbr/loop.py", "params.yaml", "dvc.lock", "reports/metrics.json"):
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("0\n")
    for cmd in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "x"]):
        subprocess.run(["git", *cmd], cwd=tmp_path, check=True)
    monkeypatch.chdir(tmp_path)
    for f in ("params.yaml", "dvc.lock", "reports/metrics.json"):
        (tmp_path / f).write_text("1\n")
    assert tracking.git_state()["git.dirty"] == "false"
    (tmp_path / "pbr/loop.py").write_text("1\n")
    assert tracking.git_state()["git.dirty"] == "true"


def test_tracking_anchors_to_the_repository_from_a_queue_workspace(tmp_path, monkeypatch):
    from stages.runtime import tracking

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    ws = tmp_path / "repo" / ".dvc" / "tmp" / "exps" / "standalone" / "tmpabc"
    ws.mkdir(parents=True)
    assert tracking.anchor(ws) == tmp_path / "repo"
    assert tracking.tracking_uri(ws) == f"sqlite:///{tmp_path / 'repo' / 'mlflow.db'}"
    assert tracking.anchor(tmp_path / "repo") == tmp_path / "repo"
    # MLflow's own example URI, relative: the repository's store too, not one in the workspace DVC
    # deletes after the run (every queued run was lost there); absolute and server URIs as given.
    for given, want in (("sqlite:///runs/team.db", f"sqlite:///{tmp_path / 'repo' / 'runs' / 'team.db'}"),
                        ("sqlite:////abs/m.db", "sqlite:////abs/m.db"), ("http://h:5000", "http://h:5000")):
        monkeypatch.setenv("MLFLOW_TRACKING_URI", given)
        assert tracking.tracking_uri(ws) == want


def test_a_runs_name_says_its_settings(tmp_path, monkeypatch, records_to_files):
    """MLflow's run list showed DVC's experiment name alone (`dvc exp run` without -n: peppy-dado, which
    says nothing of the run) or, under dvc repro, method-dataset-hash without the seed. pbr sweep's
    names say the settings already."""
    from stages.runtime import tracking

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PBR_GIT_COMMIT", "c" * 40)
    (tmp_path / "params.yaml").write_text("seed: 1\n")
    flat = {"method.name": "pbr", "data.dataset": "cifar10", "method.buffer_size": 200, "seed": 1}
    for exp_name in ("peppy-dado", "", "c10-pbr-b200-ord-ir0.01-s1", "fid-pbr-s1-proxy"):
        monkeypatch.setenv("DVC_EXP_NAME", exp_name)
        with tracking.stage_run("prepare", flat, tmp_path / "params.yaml"):
            pass
    assert sorted(r.info.run_name for r in records_to_files.search_runs(["pbr"])) == [
        "c10-pbr-b200-ord-ir0.01-s1", "fid-pbr-s1-proxy", "pbr-cifar10-b200-s1", "pbr-cifar10-b200-s1 (peppy-dado)"]
    # params.yaml's buffer size is no part of a method that keeps none; a method this checkout does not
    # know (another checkout's, an imported run's) keeps it.
    assert tracking.run_name({**flat, "method.name": "sgd"}, "peppy-dado") == "sgd-cifar10-s1 (peppy-dado)"
    assert tracking.run_name({**flat, "method.name": "mine"}, "") == "mine-cifar10-b200-s1"


def test_a_command_in_a_subfolder_reads_the_repositorys_store(tmp_path, monkeypatch):
    """`pbr report` (or `pbr ui`) from docs/ read a new, empty store there: "no finished runs"."""
    from stages.runtime import tracking

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    repo = tmp_path / "repo"
    (repo / ".dvc").mkdir(parents=True)
    (repo / "dvc.yaml").write_text("stages: {}\n")
    (repo / "docs" / "figures").mkdir(parents=True)
    assert tracking.tracking_uri(repo / "docs" / "figures") == f"sqlite:///{repo / 'mlflow.db'}"
    assert tracking.offline_uri(repo / "docs") == f"sqlite:///{repo / 'mlflow-offline' / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///runs/team.db")
    assert tracking.tracking_uri(repo / "docs") == f"sqlite:///{repo / 'runs' / 'team.db'}"
    # A bare word is no store: MLflow read it as its retired file store, its message cut mid-word.
    from pbr.errors import UserError

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "garbage")
    with pytest.raises(UserError, match=r"^MLFLOW_TRACKING_URI=garbage: not a store this project opens; give "
                                        r"sqlite:///PATH.db"):
        tracking.tracking_uri(repo)
    # Outside a DVC project, the folder it runs in (a bare folder of params.yaml, as the tests use).
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    (tmp_path / "bare").mkdir()
    assert tracking.tracking_uri(tmp_path / "bare") == f"sqlite:///{tmp_path / 'bare' / 'mlflow.db'}"


def test_dvc_lock_hashes_only_while_the_lock_describes_the_params_of_this_run(finished, tmp_path, monkeypatch):
    """`pbr train` then `pbr evaluate` by hand after an edit of params.yaml, or of the code: dvc.lock
    still names the earlier run's models, and evaluate linked the new run to them. Under DVC (which
    sets DVC_STAGE) the lock's entries for prepare and train are this execution's."""
    import yaml

    from stages.pipeline.evaluate import dvc_lock_hashes

    lock = yaml.safe_load((finished / "dvc.lock").read_text())["stages"]
    want = {f"dvc.md5.{o['path']}": o["md5"] for s in ("prepare", "train") for o in lock[s]["outs"]}
    monkeypatch.setenv("DVC_STAGE", "evaluate")
    assert dvc_lock_hashes(finished / "dvc.lock", finished / "params.yaml") == want
    params = yaml.safe_load((finished / "params.yaml").read_text())
    params["model"]["width"] += 4
    edited = tmp_path / "params.yaml"
    edited.write_text(yaml.safe_dump(params))
    assert dvc_lock_hashes(finished / "dvc.lock", edited) == {}
    # `pbr train` by hand after a code edit (params the same), then `dvc repro -s evaluate`: the lock
    # still names the earlier models; the folder's run.json is not the one DVC's listing of it holds.
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(finished, copy, symlinks=True)
    assert dvc_lock_hashes(copy / "dvc.lock", copy / "params.yaml") == want
    # A cache moved with `dvc cache dir --global` (a cluster's shared one): DVC's listing is read there.
    shutil.move(copy / ".dvc" / "cache", tmp_path / "shared-cache")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))  # where DVC keeps its --global config
    (tmp_path / "xdg" / "dvc").mkdir(parents=True)
    (tmp_path / "xdg" / "dvc" / "config").write_text(f"[cache]\n    dir = {tmp_path / 'shared-cache'}\n")
    assert dvc_lock_hashes(copy / "dvc.lock", copy / "params.yaml") == want
    run_json = copy / "artifacts/train/run.json"
    run_json.unlink()  # a link into the cache, maybe: write a new file, not through it
    run_json.write_text((finished / "artifacts/train/run.json").read_text().replace('"fingerprint": "', '"fingerprint": "0'))
    assert dvc_lock_hashes(copy / "dvc.lock", copy / "params.yaml") == {}
    monkeypatch.delenv("DVC_STAGE")  # by hand: the code may have changed since DVC's run, params or not
    assert dvc_lock_hashes(finished / "dvc.lock", finished / "params.yaml") == {}


def test_the_scores_are_this_trainings_only_while_the_lock_says_so(finished, tmp_path):
    """evaluate records score's outputs in a run where DVC skipped score: only where they are the
    scoring of this execution's models with today's score params (not after `dvc repro evaluate`
    following a training that was never scored)."""
    import shutil

    import yaml

    from stages.pipeline.evaluate import scored_this_training

    lock = yaml.safe_load((finished / "dvc.lock").read_text())["stages"]
    linked = {f"dvc.md5.{o['path']}": o["md5"] for s in ("prepare", "train") for o in lock[s]["outs"]}
    assert scored_this_training(linked, finished / "dvc.lock", finished / "params.yaml")
    assert not scored_this_training({}, finished / "dvc.lock", finished / "params.yaml")  # not under DVC
    retrained = {**linked, "dvc.md5.artifacts/train": "0" * 32 + ".dir"}
    assert not scored_this_training(retrained, finished / "dvc.lock", finished / "params.yaml")
    for key, value in (("score", "temperature"), ("train", "eval_batch_size")):
        params = yaml.safe_load((finished / "params.yaml").read_text())
        params[key][value] = 7
        (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
        assert not scored_this_training(linked, finished / "dvc.lock", tmp_path / "params.yaml"), key
    copy = tmp_path / "copy"  # the scores there now are not the ones dvc.lock names
    shutil.copytree(finished, copy, symlinks=True)
    (copy / "artifacts/score/scores.parquet").unlink()
    (copy / "artifacts/score/scores.parquet").write_bytes(b"other")
    assert not scored_this_training(linked, copy / "dvc.lock", copy / "params.yaml")


def test_a_missing_output_in_a_queued_runs_workspace_is_a_pipeline_file(tmp_path, monkeypatch):
    """A queued run works in a copy under .dvc/tmp/exps with its own dvc.yaml: its data/ and
    artifacts/ are pipeline files (`dvc checkout` restores them), not paths to check."""
    from stages.cli import _pipeline_file

    ws = tmp_path / "repo" / ".dvc" / "tmp" / "exps" / "tmpabc"
    ws.mkdir(parents=True)
    (ws / "dvc.yaml").write_text("stages: {}\n")
    monkeypatch.chdir(ws)
    assert _pipeline_file("data/prepared/manifest.json") and _pipeline_file(str(ws / "artifacts/train/run.json"))
    assert not _pipeline_file("mlflow-offline/mlflow.db") and not _pipeline_file("/proc/x")
