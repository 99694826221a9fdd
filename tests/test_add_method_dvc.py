"""The add-a-method recipe of docs/architecture.md, executed as written: its example file, verbatim,
plus the one registry line, in a copy of a finished project; nothing else is edited. The new
method declares `gamma`, a key oEWC also declares with another meaning: each lives under its own
method's name. It trains through `dvc exp run` and reads as its own row in `pbr report`."""

import json
import re
import subprocess

import pytest

from conftest import ROOT
from project import BIN, commit, copy_project, env

pytestmark = pytest.mark.slow


def _example() -> str:
    """The checklist's example file, as the page shows it."""
    page = (ROOT / "docs/architecture.md").read_text()
    section = page[page.index("## Adding a method: the checklist"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _register(init: str) -> str:
    """The registry line of step 3: the import, and the class at the end of METHODS."""
    imports = init.index("\n\n# In the paper's table order")
    init = init[:imports] + "\nfrom pbr.methods.mine import Mine" + init[imports:]
    registry = re.search(r"METHODS = registry\(\((.*?)\)\)", init, re.S)
    return init[:registry.end(1)] + ", Mine" + init[registry.end(1):]


def test_the_docs_example_method_trains_through_dvc_exp_run(tmp_path, finished, monkeypatch):
    repo = copy_project(finished, tmp_path / "repo")
    (repo / "pbr/methods/mine.py").write_text(_example())
    init = repo / "pbr/methods/__init__.py"
    init.write_text(_register(init.read_text()))
    commit(repo, "a method of my own")
    # The copy's code, not the installed project's, runs in `pbr` (dvc runs it in a shell).
    monkeypatch.setenv("PYTHONPATH", str(repo))

    def exp_run(*sets):
        args = [str(BIN / "dvc"), "exp", "run", *(a for s in sets for a in ("-S", s))]
        return subprocess.run(args, cwd=repo, env=env(), capture_output=True, text=True, timeout=900)

    r = exp_run("method.name=mine", "++method.mine.gamma=0.5", "train.epochs=1")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run = json.loads((repo / "artifacts/train/run.json").read_text())
    assert run["settings"]["method"] == "mine" and run["settings"]["gamma"] == 0.5
    # auto from the example's `best` (the project is CIFAR-10 at buffer 200)
    assert (run["settings"]["alpha"], run["settings"]["lr"]) == (0.3, 0.05)
    metrics = json.loads((repo / "reports/metrics.json").read_text())
    last = json.loads((repo / "artifacts/train/accuracy.json").read_text())["class_il"]["matrix"][-1]
    assert metrics["class_il"]["acc"] == pytest.approx(sum(last) / len(last), abs=1e-4)  # evaluate ran on it

    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    [mine] = client.search_runs([client.get_experiment_by_name("pbr").experiment_id],
                                filter_string="params.`method.name` = 'mine'")
    params = mine.data.params
    assert params["method.mine.gamma"] == "0.5" and "method.ewc_on.gamma" not in params
    assert not any(k.startswith("method.pbr.") for k in params)  # only the running method's section

    # A bad value of the new key: one line naming it, before anything runs.
    r = exp_run("method.name=mine", "++method.mine.gamma=-1")
    said = r.stdout + r.stderr
    assert r.returncode != 0 and "method.mine.gamma = -1 is not allowed; it must be a positive number" in said

    r = subprocess.run([str(BIN / "pbr"), "report"], cwd=repo, env=env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "| Mine (gamma 0.5) |" in r.stdout, r.stdout
