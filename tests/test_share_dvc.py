"""Team sharing with the real tools: a local-directory DVC remote and a bare git repository.

Push the prepared shards, models and buffers; clone elsewhere and `dvc pull` the identical
artifacts, with nothing for `dvc repro` to run; `dvc exp push` / `dvc exp pull` one experiment."""

import json

import pytest

from project import commit, copy_project, dvc, run, tree_bytes

# What is shared is the data, models, buffers and experiments; the runs' records are not the subject
# here (conftest's records_to_files).
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("records_to_files")]

SHARED = ("data/prepared", "artifacts/train", "artifacts/score")


def test_push_pull_and_experiments_between_two_clones(tmp_path, finished):
    a = copy_project(finished, tmp_path / "alice")
    origin, store = tmp_path / "origin.git", tmp_path / "dvc-store"
    run(["git", "init", "-q", "--bare", "-b", "main", str(origin)], tmp_path)
    dvc(a, "remote", "add", "-d", "team", str(store))
    commit(a, "team remote")
    run(["git", "remote", "add", "origin", str(origin)], a)
    run(["git", "push", "-q", "origin", "main"], a)
    dvc(a, "push")

    b = tmp_path / "bob"
    run(["git", "clone", "-q", str(origin), str(b)], tmp_path)
    assert not (b / "artifacts").exists()
    dvc(b, "pull")
    for out in SHARED:
        assert tree_bytes(b / out) == tree_bytes(a / out), out
    assert "up to date" in dvc(b, "status").stdout
    r = dvc(b, "repro")
    assert "Running stage" not in r.stdout and "didn't change" in r.stdout

    # One experiment (a different scoring temperature: only `score` re-runs), shared through
    # the bare repository (git refs) and the DVC remote (its outputs).
    out = dvc(a, "exp", "run", "-n", "warm-score", "-S", "score.temperature=0.5").stdout
    assert "Running stage 'score'" in out and "Running stage 'train'" not in out
    dvc(a, "exp", "push", "origin", "warm-score")
    dvc(b, "exp", "pull", "origin", "warm-score")
    assert "warm-score" in dvc(b, "exp", "ls", "--name-only").stdout
    dvc(b, "exp", "apply", "warm-score")
    dvc(b, "checkout")
    assert tree_bytes(b / "artifacts/score") == tree_bytes(a / "artifacts/score")
    assert tree_bytes(b / "artifacts/score") != tree_bytes(finished / "artifacts/score")
    shown = json.loads(dvc(b, "exp", "show", "--json").stdout)
    assert "warm-score" in json.dumps(shown)
