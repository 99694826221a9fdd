"""`pbr report`: runs from a small sqlite MLflow store -> tables, CSV, paper numbers."""

import csv
import math
from pathlib import Path

import pytest

from pbr.errors import UserError
from stages.experiments import report
from stages.experiments.paper_results import PAPER_RESULTS
from stages.experiments.report import RunRecord

ROOT = Path(__file__).resolve().parents[1]
# mlflow's own sqlalchemy usage, not ours
pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")

BASE = {"data.setting": "ordered", "data.imbalance_ratio": "0.01", "data.dataset": "cifar10",
        "data.n_tasks": "5", "method.buffer_size": "200", "method.pbr.buffer_order": "uncertain_weighted",
        "model.head": "auto", "train.epochs": "50", "data.root": "data/raw"}

# (params over BASE, metrics, status, complete tag)
RUNS = [
    ({"method.name": "pbr", "seed": "0"}, {"class_il.acc": 50, "task_il.acc": 88, "class_il.bwt": -10}, "FINISHED", True),
    ({"method.name": "pbr", "seed": "1"}, {"class_il.acc": 52, "task_il.acc": 90, "class_il.bwt": -12}, "FINISHED", True),
    ({"method.name": "pbr", "seed": "2"}, {"class_il.acc": 57, "task_il.acc": 92, "class_il.bwt": -14}, "FINISHED", True),
    ({"method.name": "er", "seed": "0"}, {"class_il.acc": 40, "task_il.acc": 85}, "FINISHED", True),
    ({"method.name": "er", "seed": "1"}, {"class_il.acc": 44, "task_il.acc": 86}, "FINISHED", True),
    ({"method.name": "pbr", "method.pbr.buffer_order": "random", "seed": "0"},
     {"class_il.acc": 45, "task_il.acc": 83}, "FINISHED", True),
    ({"method.name": "sgd", "seed": "0"}, {"class_il.acc": 19, "task_il.acc": 70}, "FINISHED", True),
    # ignored: still running (complete tag or not), finished without the complete tag
    ({"method.name": "pbr", "seed": "3"}, {"class_il.acc": 0, "task_il.acc": 0}, "RUNNING", True),
    ({"method.name": "pbr", "seed": "4"}, {"class_il.acc": 0, "task_il.acc": 0}, "FAILED", True),
    ({"method.name": "pbr", "seed": "5"}, {"class_il.acc": 0, "task_il.acc": 0}, "FINISHED", False),
    # shuffled, IR 0.1: a table of its own
    ({"method.name": "pbr", "seed": "0", "data.setting": "shuffled", "data.imbalance_ratio": "0.1",
      "data.dataset": "cifar100"}, {"class_il.acc": 60, "task_il.acc": 88}, "FINISHED", True),
]


def _add_run(client, exp_id, params, metrics, status, complete, t, tags=None):
    """A run as the pipeline records it: the train stage tags the device it resolved (pbr.device)."""
    from mlflow.entities import Metric, Param

    tags = {"pbr.device": "cpu", **({"pbr.complete": "true"} if complete else {}), **(tags or {})}
    run = client.create_run(exp_id, start_time=t, tags=tags)
    client.log_batch(run.info.run_id, params=[Param(k, v) for k, v in {**BASE, **params}.items()],
                     metrics=[Metric(k, float(v), t, 0) for k, v in metrics.items()])
    if status != "RUNNING":
        client.set_terminated(run.info.run_id, status)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from mlflow import MlflowClient

    tmp = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{tmp}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    exp_id = client.create_experiment("pbr", artifact_location=(tmp / "artifacts").as_uri())
    for i, (params, metrics, status, complete) in enumerate(RUNS):
        _add_run(client, exp_id, params, metrics, status, complete, 1_700_000_000_000 + i)
    empty = client.create_experiment("empty", artifact_location=(tmp / "artifacts2").as_uri())
    _add_run(client, empty, {"method.name": "pbr", "seed": "0"}, {"class_il.acc": 1}, "FINISHED", False, 1)
    machines = client.create_experiment("machines", artifact_location=(tmp / "artifacts3").as_uri())
    for i, (params, tags, metrics) in enumerate(MACHINE_RUNS):
        _add_run(client, machines, params, metrics, "FINISHED", True, 1_700_000_000_000 + i, tags)
    return uri


AUTO = {"train.device": "auto", "train.precision": "auto"}
CPU, CUDA = {"pbr.device": "cpu", "resolved.precision": "fp32"}, {"pbr.device": "cuda", "resolved.precision": "bf16"}
# One cell (ordered, IR 0.01, CIFAR-10, buffer 200) run on a CPU in fp32, on a GPU in bf16 (auto
# resolves to each), on a GPU in fp32 (asked for), and once where nothing says which device.
MACHINE_RUNS = [  # (params over BASE, tags, metrics)
    ({**AUTO, "method.name": "pbr", "seed": "0"}, CPU, {"class_il.acc": 50, "task_il.acc": 88}),
    ({**AUTO, "method.name": "pbr", "seed": "1"}, CPU, {"class_il.acc": 54, "task_il.acc": 90}),
    # from before the pbr.device tag, with train.device cpu: a CPU run
    ({"train.device": "cpu", "train.precision": "fp32", "method.name": "pbr", "seed": "2"}, {"pbr.device": ""},
     {"class_il.acc": 52, "task_il.acc": 92}),
    ({**AUTO, "method.name": "pbr", "seed": "0"}, CUDA, {"class_il.acc": 60, "task_il.acc": 91}),
    ({**AUTO, "method.name": "pbr", "seed": "1"}, {**CUDA, "pbr.device": "cuda:0"}, {"class_il.acc": 64, "task_il.acc": 93}),
    ({"train.device": "cuda", "train.precision": "fp32", "method.name": "pbr", "seed": "0"}, {"pbr.device": "cuda"},
     {"class_il.acc": 70, "task_il.acc": 95}),
    # no tag and train.device auto: the device is unknown
    ({**AUTO, "method.name": "pbr", "seed": "3"}, {"pbr.device": "", "resolved.precision": "fp32"},
     {"class_il.acc": 10, "task_il.acc": 20}),
    ({**AUTO, "method.name": "er", "seed": "0"}, CPU, {"class_il.acc": 40, "task_il.acc": 80}),
    ({**AUTO, "method.name": "er", "seed": "1"}, CPU, {"class_il.acc": 46, "task_il.acc": 84}),
    ({**AUTO, "method.name": "er", "seed": "0"}, CUDA, {"class_il.acc": 41, "task_il.acc": 81}),
    ({**AUTO, "method.name": "er", "seed": "1"}, CUDA, {"class_il.acc": 43, "task_il.acc": 85}),
]


@pytest.fixture
def env(store, monkeypatch, tmp_path):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    monkeypatch.chdir(tmp_path)
    return store


def _groups(rep):
    return {(g.setting, g.dataset, g.method, g.buffer_size): g for g in rep.groups}


def test_means_stds_counts_and_paper_numbers(env):
    rep = report.run()
    gs = _groups(rep)
    assert set(gs) == {("ordered", "cifar10", "PBR", 200), ("ordered", "cifar10", "ER", 200),
                       ("ordered", "cifar10", "PBR (random)", 200), ("ordered", "cifar10", "SGD", None),
                       ("shuffled", "cifar100", "PBR", 200)}
    pbr = gs["ordered", "cifar10", "PBR", 200]
    assert [r.params["seed"] for r in pbr.runs] == ["0", "1", "2"]  # RUNNING, FAILED, untagged left out
    m, s, n = pbr.stats("class_il", "acc")
    assert (m, n) == (53.0, 3) and math.isclose(s, math.sqrt(13))  # (9 + 1 + 16) / 2
    assert pbr.stats("task_il", "acc") == (90.0, 2.0, 3)
    assert pbr.paper() == (51.00, 89.99)
    m, s, n = gs["ordered", "cifar10", "ER", 200].stats("class_il", "acc")
    assert (m, n) == (42.0, 2) and math.isclose(s, math.sqrt(8))
    assert gs["ordered", "cifar10", "PBR (random)", 200].stats("class_il", "acc") == (45.0, 0.0, 1)
    assert gs["ordered", "cifar10", "PBR (random)", 200].paper() == (44.77, 82.50)
    assert gs["ordered", "cifar10", "SGD", None].paper() == (19.62, 72.65)
    shuffled = gs["shuffled", "cifar100", "PBR", 200]
    assert shuffled.imbalance_ratio == 0.1 and shuffled.paper() == (59.33, 87.99)


def test_markdown_layout(env):
    text = report.run().text
    lines = text.splitlines()
    i = lines.index("## ordered, IR 0.01")
    assert lines[i + 2] == "Ran on cpu, fp32."
    i += 2  # the table starts two lines further down
    assert lines[i + 2] == ("| Buffer | Method | Seq-CIFAR-10-LT (5 tasks) Class-IL "
                            "| Seq-CIFAR-10-LT (5 tasks) Task-IL |")
    assert lines[i + 3] == "|---|---|---|---|"
    rows = lines[i + 4:i + 8]
    assert [r.split(" | ")[:2] for r in rows] == [["| -", "SGD"], ["| 200", "ER"],
                                                   ["| 200", "PBR (random)"], ["| 200", "PBR"]]
    assert rows[3] == "| 200 | PBR | 53.00 ± 3.61 (n=3) [paper 51.00] | 90.00 ± 2.00 (n=3) [paper 89.99] |"
    assert rows[1] == "| 200 | ER | 42.00 ± 2.83 (n=2) [paper 39.14] | 85.50 ± 0.71 (n=2) [paper 85.72] |"
    assert i + 8 == len(lines) or not lines[i + 8].startswith("|")  # one row per method, no more
    j = lines.index("## shuffled, IR 0.1")
    assert j > i
    # One seed: its value and n, no "± 0.00" (a spread of one seed is no figure; the CSV leaves it empty).
    assert lines[j + 6] == "| 200 | PBR | 60.00 (n=1) [paper 59.33] | 88.00 (n=1) [paper 87.99] |"


def test_csv_written_atomically_with_one_row_per_group(env, tmp_path):
    rep = report.run()
    path = tmp_path / "reports" / "report.csv"
    assert rep.csv_path == Path("reports/report.csv") and path.is_file()
    assert not [p for p in path.parent.iterdir() if p.name != "report.csv"]  # no temp file left
    with path.open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0])[:13] == ["budget", "setting", "imbalance_ratio", "dataset", "method", "buffer_size", "n_runs",
                                  "class_il_mean", "class_il_std", "task_il_mean", "task_il_std",
                                  "paper_class_il", "paper_task_il"]
    assert len(rows) == 5
    pbr = next(r for r in rows if r["method"] == "PBR" and r["setting"] == "ordered")
    assert pbr == {"budget": "full protocol", "setting": "ordered", "imbalance_ratio": "0.01", "dataset": "cifar10", "method": "PBR",
                   "buffer_size": "200", "n_runs": "3", "class_il_mean": "53.0000", "class_il_std": "3.6056",
                   "task_il_mean": "90.0000", "task_il_std": "2.0000", "paper_class_il": "51.0000",
                   "paper_task_il": "89.9900", "metric": "acc", "n_tasks": "5", "paper_n_tasks": "5",
                   "device": "cpu", "precision": "fp32", "n_seeds": "3", "class_il_n": "3", "task_il_n": "3",
                   "seeds": "0-2"}
    sgd = next(r for r in rows if r["method"] == "SGD")
    # one seed: no spread to give (it read 0.0000, three seeds without any)
    assert sgd["buffer_size"] == "" and sgd["n_runs"] == "1" and sgd["class_il_std"] == "" and sgd["class_il_n"] == "1"
    shuffled = next(r for r in rows if r["setting"] == "shuffled")
    assert (shuffled["imbalance_ratio"], shuffled["dataset"], shuffled["paper_class_il"]) == ("0.1", "cifar100", "59.3300")


def test_other_metric_and_markdown_file(env, tmp_path):
    rep = report.run(metric="bwt", csv_path=tmp_path / "bwt.csv", markdown_path=tmp_path / "out" / "r.md")
    assert (tmp_path / "out" / "r.md").read_text() == rep.text
    assert "| 200 | PBR | -12.00 ± 2.00 (n=3) | - |" in rep.text and "[paper" not in rep.text
    with (tmp_path / "bwt.csv").open() as f:
        pbr = next(r for r in csv.DictReader(f) if r["method"] == "PBR" and r["setting"] == "ordered")
    assert (pbr["class_il_mean"], pbr["task_il_mean"], pbr["paper_class_il"], pbr["metric"]) == ("-12.0000", "", "", "bwt")
    # only the three PBR runs logged a BWT; the row's seeds count every run (the random variant's
    # is its own row)
    assert (pbr["class_il_n"], pbr["task_il_n"]) == ("3", "0")
    with pytest.raises(UserError, match="--metric"):
        report.run(metric="accuracy")


def test_no_runs_message(env, tmp_path):
    for kw in ({"experiment": "empty"}, {"experiment": "missing"},
               {"tracking_uri": f"sqlite:///{tmp_path}/none/mlflow.db"}):
        rep = report.run(**kw)
        assert rep.groups == [] and rep.csv_path is None
        assert rep.text.count("\n") == 1 and "No finished pipeline runs" in rep.text and "dvc repro" in rep.text
    assert not (tmp_path / "none").exists() and not (tmp_path / "reports").exists()
    # What an earlier report wrote no longer reads as current: the table's rows and figures go.
    old = tmp_path / "old"
    (old / "report").mkdir(parents=True)
    (old / "report.csv").write_text(",".join(report.CSV_COLUMNS) + "\nfull protocol,ordered,0.01,cifar10,PBR,200\n")
    (old / "report" / "ordered-ir-0.01-acc.png").write_bytes(b"png")
    (old / "report" / "ordered-ir-0.01-bwt.png").write_bytes(b"png")  # another metric's: kept
    kept = (old / "report.csv").read_text()
    report.run(experiment="missing", csv_path=old / "report.csv", figures_dir=old / "report")  # a typo
    assert (old / "report.csv").read_text() == kept and len(list((old / "report").iterdir())) == 2
    report.run(experiment="empty", csv_path=old / "report.csv", figures_dir=old / "report")
    assert (old / "report.csv").read_text() == ",".join(report.CSV_COLUMNS) + "\n"
    assert [p.name for p in (old / "report").iterdir()] == ["ordered-ir-0.01-bwt.png"]


def test_unreadable_store_is_a_user_error(tmp_path):
    (tmp_path / "mlflow.db").write_bytes(b"not a database at all" * 100)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    with pytest.raises(UserError) as e:
        report.run(tracking_uri=uri)
    assert uri in str(e.value) and "\n" not in str(e.value)


def test_labels_repeats_and_mixed_settings():
    p = {**BASE, "method.name": "pbr"}
    assert report.method_label(p) == "PBR"
    assert report.method_label({**p, "model.head": "cosine"}) == "PBR"
    assert report.method_label({**p, "model.head": "linear"}) == "PBR (linear)"
    assert report.method_label({**p, "model.head": "linear", "method.pbr.buffer_order": "random"}) == "PBR (random, linear)"
    assert report.method_label({**BASE, "method.name": "derpp"}) == "DER++"
    assert report.method_label({**BASE, "method.name": "er", "model.head": "cosine"}) == "ER (cosine)"
    assert report.buffer_of({**BASE, "method.name": "joint"}) is None
    assert PAPER_RESULTS["ordered", 0.01, "cifar10", "PBR (linear)", 200] == (33.66, 76.45)

    runs = [RunRecord("a", {**p, "seed": "0"}, {"class_il.acc": 10.0}, 1),
            RunRecord("b", {**p, "seed": "0"}, {"class_il.acc": 20.0}, 2),  # repeat of a: newest kept
            RunRecord("c", {**p, "seed": "1", "train.batch_size": "16"}, {"class_il.acc": 40.0}, 3),
            RunRecord("d", {"method.name": "pbr"}, {}, 4)]  # no data.* params
    groups, skipped = report.group_runs(runs)
    (g,) = groups
    assert [r.run_id for r in g.runs] == ["b", "c"] and g.stats("class_il", "acc")[0] == 30.0
    assert any("1 older run(s)" in n for n in g.notes)
    assert any("train.batch_size (16, <unset>)" in n for n in g.notes)
    assert len(skipped) == 1 and "run d" in skipped[0]
    text = report.render_markdown(groups, "acc", skipped)
    assert "- note: PBR, buffer 200, Seq-CIFAR-10-LT (5 tasks): runs averaged together differ in train.batch_size" in text


def test_budgets_get_their_own_tables_and_readings_their_own_rows():
    """A run at another width or epochs is never averaged with the full protocol; the proxy budget
    of `pbr sweep --budget proxy` is named; PBR readings and a baseline's non-default lr are rows."""
    p = {**BASE, "method.name": "pbr", "seed": "0"}
    proxy = {"model.width": "8", "train.epochs": "[4, 8, 16, 40, 80]", "method.reservoir": "first_epoch"}
    runs = [RunRecord("full", p, {"class_il.acc": 50.0}),
            RunRecord("short", {**p, "train.epochs": "5", "model.width": "20"}, {"class_il.acc": 20.0}),
            RunRecord("proxy", {**p, **proxy}, {"class_il.acc": 30.0}),
            RunRecord("proxy-class", {**p, **proxy, "method.pbr.offset": "class", "method.pbr.kl_classes": "all"},
                      {"class_il.acc": 31.0}),
            RunRecord("er-paper", {**p, **proxy, "method.name": "er", "train.lr": "0.03"}, {"class_il.acc": 32.0}),
            RunRecord("er-tuned", {**p, **proxy, "method.name": "er", "train.lr": "0.1", "method.pbr.tau1": "0.1"},
                      {"class_il.acc": 33.0})]
    # Spelling out a default is the default: ER at lr 0.1 is ER, PBR at alpha 1.0 is PBR, and a
    # PBR run's reservoir setting (which it does not use) does not move it out of the proxy.
    # PBR's own settings (here tau1) do not make two ER runs differ.
    runs += [RunRecord("er-auto", {**p, **proxy, "method.name": "er", "train.lr": "auto", "seed": "1",
                                   "method.pbr.tau1": "1.0"},
                       {"class_il.acc": 35.0}),
             RunRecord("alpha", {**p, **proxy, "method.pbr.alpha": "1.0", "method.reservoir": "every_epoch", "seed": "1"},
                       {"class_il.acc": 28.0})]
    # PBR filled by the online reservoir reads the reservoir's rule: at every epoch it is not the proxy.
    runs += [RunRecord("res", {**p, **proxy, "method.pbr.sampling": "reservoir"}, {"class_il.acc": 27.0}),
             RunRecord("res-every", {**p, **proxy, "method.pbr.sampling": "reservoir", "method.reservoir": "every_epoch"},
                       {"class_il.acc": 26.0})]
    groups, _ = report.group_runs(runs)
    assert {(g.budget, g.method) for g in groups} == {
        ("proxy", "PBR (online reservoir)"), ("width 8, epochs [4, 8, 16, 40, 80]", "PBR (online reservoir)"),
        ("full protocol", "PBR"), ("width 20, epochs 5", "PBR"), ("proxy", "PBR"),
        ("proxy", "PBR (per-class offset, KL over all)"), ("proxy", "ER (lr 0.03)"), ("proxy", "ER")}
    by = {(g.budget, g.method): g for g in groups}
    assert [r.run_id for r in by["proxy", "ER"].runs] == ["er-tuned", "er-auto"]
    assert [r.run_id for r in by["proxy", "PBR"].runs] == ["proxy", "alpha"]
    assert not any("differ in" in n for g in groups for n in g.notes)
    text = report.render_markdown(groups)
    assert text.index("## ordered, IR 0.01\n") < text.index("## ordered, IR 0.01 (proxy)") < text.index(
        "## ordered, IR 0.01 (width 20, epochs 5)")
    full, proxy_table = text.split("## ordered, IR 0.01 (proxy)")[0], text.split("## ordered, IR 0.01 (proxy)")[1]
    assert "| 200 | PBR | 50.00 (n=1) [paper 51.00]" in full
    assert "[paper" not in proxy_table  # the paper's numbers sit beside the full protocol only
    assert "[paper X] is the published number" in text
    # A report of cheaper budgets only shows no paper number, and no legend for one.
    cheap = report.render_markdown([g for g in groups if g.budget != "full protocol"])
    assert "[paper" not in cheap
    assert "| 200 | ER (lr 0.03) | 32.00" in proxy_table
    assert "- note: the paper ran every method at lr 0.03; these ran at their own lr (row 'NAME (lr 0.03)' " \
           "where run): ER 0.1 (Mammoth utils/best_args.py @5bb9275 seq-cifar10 (buffer 200, 500, 5120))" in proxy_table


def test_paper_marks_another_number_of_tasks():
    p = {**BASE, "method.name": "pbr", "data.dataset": "cifar100", "seed": "0"}
    groups, _ = report.group_runs([RunRecord("a", p, {"class_il.acc": 25.0, "task_il.acc": 50.0})])
    assert "| 200 | PBR | 25.00 (n=1) [paper 24.18, 10 tasks] | 50.00 (n=1) [paper 50.66, 10 tasks] |" \
        in report.render_markdown(groups)


def test_a_method_without_class_il_prints_a_dash_as_the_paper_does():
    """PNN picks its column by the task: its Class-IL metric (the newest column's) is not a PNN result."""
    p = {**BASE, "method.name": "pnn", "seed": "0"}
    groups, _ = report.group_runs([RunRecord("a", p, {"class_il.acc": 19.0, "task_il.acc": 80.0})])
    assert "| - | PNN | - | 80.00 (n=1) [paper 84.72] |" in report.render_markdown(groups)


def test_a_run_is_read_with_the_values_it_ran_with_not_todays_defaults():
    """PBR's auto lr was 0.03 before it became 0.1: an old run's resolved tag keeps it apart."""
    old = report.pin_auto({**BASE, "method.name": "pbr", "train.lr": "auto", "method.pbr.alpha": "auto"},
                          {"resolved.lr": "0.03", "resolved.alpha": "1.0", "resolved.dropout": "0.1"})
    new = {**BASE, "method.name": "pbr", "train.lr": "auto"}
    assert report.method_label(old) == "PBR (lr 0.03)" and report.method_label(new) == "PBR"
    assert old["method.pbr.alpha"] == "1.0" and "model.dropout" not in old  # only keys the run has


def test_cli(env, tmp_path, pbr_main):
    """`pbr report` through the CLI's main() in this process (conftest's pbr_main); test_add_method_dvc
    runs it as a process."""
    r = pbr_main("report", cwd=tmp_path, env={"MLFLOW_TRACKING_URI": env})
    assert r.returncode == 0, r.stderr
    assert "## ordered, IR 0.01" in r.stdout and "| 200 | PBR | 53.00 ± 3.61 (n=3) [paper 51.00]" in r.stdout
    assert (tmp_path / "reports" / "report.csv").is_file() and "Traceback" not in r.stderr
    assert "wrote reports/report/ordered-ir-0.01-acc.png" in r.stderr
    assert (tmp_path / "reports" / "report" / "shuffled-ir-0.1-acc.png").is_file()
    assert "logged to MLflow experiment 'pbr-report', run " in r.stderr
    # --seeds: those seeds' runs only, said in the title; none of them: said so
    r = pbr_main("report", "--seeds", "0-1", "--no-log", cwd=tmp_path, env={"MLFLOW_TRACKING_URI": env})
    assert r.returncode == 0 and "| 200 | PBR | 51.00 ± 1.41 (n=2) [paper 51.00]" in r.stdout
    assert "runs of differing settings; seeds 0-1 only)" in r.stdout.splitlines()[0]
    full = (tmp_path / "reports" / "report.csv").read_text()
    # Its files replace the full report's: the CSV names each row's seeds, the figures' titles say so.
    import csv as csv_module

    assert {row["seeds"] for row in csv_module.DictReader(full.splitlines())} <= {"0-1", "0"}
    from stages.experiments.report_figures import table_figure

    (title, gs, paper), _ = report.figure_tables(report.run(tracking_uri=env, csv_path=None, seeds=[0, 1]).groups, "acc")
    assert table_figure(title, gs, "acc", paper, [0, 1])._suptitle.get_text().endswith("seeds 0-1 only")
    r = pbr_main("report", "--seeds", "7-9", "--no-log", cwd=tmp_path, env={"MLFLOW_TRACKING_URI": env})
    assert r.returncode == 0 and r.stdout.startswith("No finished pipeline runs of seeds 7-9 in MLflow experiment")
    # The store has runs, none of those seeds: the last report's files stay (they were emptied).
    assert (tmp_path / "reports" / "report.csv").read_text() == full
    r = pbr_main("report", "--seeds", "3-1", cwd=tmp_path, env={"MLFLOW_TRACKING_URI": env})
    assert r.returncode == 2 and "--seeds 3-1: give N" in r.stderr and "Traceback" not in r.stderr
    # no store at all: the message, exit 0, and no mlflow.db created
    r = pbr_main("report", "--tracking-uri", f"sqlite:///{tmp_path}/x.db", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("No finished pipeline runs") and "dvc repro" in r.stdout
    assert r.stderr == "" and not (tmp_path / "x.db").exists()


def test_auto_precision_is_read_as_what_the_machine_chose():
    """A bf16 run and an fp32 run of train.precision: auto are different settings; an fp32 run from
    before auto (explicit fp32, channels_last False) is the same as an auto run that chose them."""
    p = {**BASE, "method.name": "er", "seed": "0", "train.precision": "auto", "train.channels_last": "auto"}
    bf16 = report.pin_auto(p, {"resolved.precision": "bf16", "resolved.channels_last": "True"})
    fp32 = report.pin_auto(p, {"resolved.precision": "fp32", "resolved.channels_last": "False"})
    old = {**p, "train.precision": "fp32", "train.channels_last": "False"}
    assert bf16["train.precision"] == "bf16" and fp32["train.precision"] == "fp32"
    assert report._signature(bf16) != report._signature(fp32)
    assert report._signature(old) == report._signature(fp32)


def test_pbr_is_paired_with_every_row_on_the_seeds_both_ran(env):
    """PBR 50, 52, 57 / 88, 90, 92 against ER 40, 44 / 85, 86 (seeds 0, 1): differences 10 and 8
    (mean 9, std sqrt 2, se 1; t_{0.975,1} = 12.706: 9 ± 12.71) and 3 and 4 (mean 3.5, se 0.5:
    3.5 ± 6.35). PBR (random) shares one seed, SGD no buffer: neither is paired."""
    text = report.run().text
    table = text.split("## ordered, IR 0.01")[1].split("## shuffled")[0]
    paired = [line for line in table.splitlines() if line.startswith("- PBR - ")]
    assert paired == ["- PBR - ER, buffer 200, Seq-CIFAR-10-LT (5 tasks): "
                      "Class-IL +9.00, 95% CI [-3.71, +21.71] (higher on 2 of n=2); "
                      "Task-IL +3.50, 95% CI [-2.85, +9.85] (higher on 2 of n=2)"]
    assert "## shuffled" in text and "- PBR - " not in text.split("## shuffled")[1]


def test_pairs_match_seeds_and_average_a_seeds_runs_of_differing_settings():
    p = {**BASE, "method.name": "pbr"}
    er = {**BASE, "method.name": "er"}
    runs = [RunRecord("p0", {**p, "seed": "0"}, {"class_il.acc": 30.0, "task_il.acc": 70.0}),
            RunRecord("p1", {**p, "seed": "1"}, {"class_il.acc": 34.0, "task_il.acc": 80.0}),
            # seed 1 again with another batch size: the seed's value is the mean of its two runs, 36
            RunRecord("p1b", {**p, "seed": "1", "train.batch_size": "16"}, {"class_il.acc": 38.0, "task_il.acc": 80.0}),
            RunRecord("p2", {**p, "seed": "2"}, {"class_il.acc": 20.0, "task_il.acc": 60.0}),
            # ER lacks seed 2 and has seed 5, which PBR lacks: pairs on seeds 0 and 1 only
            RunRecord("e0", {**er, "seed": "0"}, {"class_il.acc": 32.0, "task_il.acc": 60.0}),
            RunRecord("e1", {**er, "seed": "1"}, {"class_il.acc": 30.0, "task_il.acc": 70.0}),
            RunRecord("e5", {**er, "seed": "5"}, {"class_il.acc": 99.0, "task_il.acc": 99.0}),
            # another buffer size: no PBR of its own to pair with
            RunRecord("e0-500", {**er, "seed": "0", "method.buffer_size": "500"}, {"class_il.acc": 1.0}),
            RunRecord("e1-500", {**er, "seed": "1", "method.buffer_size": "500"}, {"class_il.acc": 1.0})]
    groups, _ = report.group_runs(runs)
    # Class-IL: 30 - 32 = -2, 36 - 30 = +6: mean +2, std sqrt(32), se 4, 12.706 * 4 = 50.82;
    # PBR higher on 1 of 2. Task-IL: +10 and +10: std 0, an interval of width 0.
    assert report.paired_lines(groups) == ["- PBR - ER, buffer 200, Seq-CIFAR-10-LT (5 tasks): "
                                           "Class-IL +2.00, 95% CI [-48.82, +52.82] (higher on 1 of n=2); "
                                           "Task-IL +10.00, 95% CI [+10.00, +10.00] (higher on 2 of n=2)"]
    # The cell counts seed 1 once, as the pairs do: (30 + 36 + 20) / 3 = 28.67, deviations 1.33, 7.33
    # and -8.67, std sqrt(130.67 / 2) = 8.08 over n=3 seeds (four runs would give 30.50, n=4).
    from stages.experiments.report_figures import SEED_OFFSET, table_figure

    pbr = next(g for g in groups if g.method == "PBR")
    text = report.render_markdown(groups)
    assert "28.67 ± 8.08 (n=3)" in text and "(n=4)" not in text
    row = next(r for r in report.csv_rows(groups) if r["method"] == "PBR")
    assert (row["n_runs"], row["n_seeds"], row["class_il_mean"]) == ("4", "3", "28.6667")
    (title, gs, paper), = report.figure_tables([g for g in groups if g.buffer_size == 200], "acc")
    drawn = _drawn(table_figure(title, gs, "acc", paper))["Seq-CIFAR-10-LT (5 tasks): Class-IL"]
    y = drawn["rows"].index("PBR · 200")
    assert sorted(x for x, at in drawn["seeds"] if at == y + SEED_OFFSET) == [20, 30, 36]
    assert (pbr.stats("task_il", "acc")[2], len(pbr.runs)) == (3, 4)


def test_t_quantile_matches_the_printed_tables_and_scipy():
    # Student's t 0.975 quantiles as printed in any table (3 decimals), and the normal limit.
    for df, printed in {1: 12.706, 2: 4.303, 4: 2.776, 9: 2.262, 29: 2.045, 120: 1.980}.items():
        assert round(report.t_quantile(df), 3) == printed
    assert 1.959 < report.t_quantile(100_000) < 1.961
    stats = pytest.importorskip("scipy.stats")
    for df in range(1, 61):
        assert math.isclose(report.t_quantile(df), stats.t.ppf(0.975, df), rel_tol=1e-9)
    assert math.isclose(report.t_quantile(7, 0.90), stats.t.ppf(0.95, 7), rel_tol=1e-9)


def test_paired_interval_over_five_seeds():
    """Differences 1, 2, 3, 4, 10: mean 4, sd sqrt(50/4) = 3.5355, se 1.5811, t_{0.975,4} = 2.7764:
    half-width 4.3899, interval [-0.39, 8.39]; PBR higher on all 5."""
    ref = {str(s): 50.0 + d for s, d in enumerate((1, 2, 3, 4, 10))}
    p = report._paired(ref, {str(s): 50.0 for s in range(5)})
    assert (p.n, p.wins, p.mean) == (5, 5, 4.0)
    assert math.isclose(p.low, 4 - 4.3899, abs_tol=1e-4) and math.isclose(p.high, 4 + 4.3899, abs_tol=1e-4)
    assert report._paired({"0": 1.0}, {"0": 0.0}) is None  # one seed: no interval


def test_runs_of_one_cell_on_two_machines_are_rows_of_their_own(env):
    """Means by hand, each over its own machine's runs only: PBR cpu 50, 54, 52 -> 52 ± 2 (the
    tagless run with train.device cpu joins it), cuda bf16 60, 64 -> 62 ± 2.83; ER cpu 40, 46 -> 43;
    ER cuda 41, 43 -> 42. Averaged across machines PBR would read 59.2 over 5."""
    rep = report.run(experiment="machines", csv_path=None)
    rows = {line.split(" | ")[1]: line for line in rep.text.splitlines() if line.startswith("| 200 |")}
    assert list(rows) == ["ER [cpu, fp32]", "ER [cuda, bf16]", "PBR [cpu, fp32]", "PBR [cuda, bf16]",
                          "PBR [cuda, fp32]", "PBR [device unknown, fp32]"]
    assert rows["PBR [cpu, fp32]"] == "| 200 | PBR [cpu, fp32] | 52.00 ± 2.00 (n=3) [paper 51.00] | " \
                                      "90.00 ± 2.00 (n=3) [paper 89.99] |"
    assert rows["PBR [cuda, bf16]"].startswith("| 200 | PBR [cuda, bf16] | 62.00 ± 2.83 (n=2) [paper 51.00] | "
                                               "92.00 ± 1.41 (n=2)")
    assert "| 70.00 (n=1)" in rows["PBR [cuda, fp32]"]
    assert "| 10.00 (n=1)" in rows["PBR [device unknown, fp32]"]
    assert "| 43.00 ± 4.24 (n=2)" in rows["ER [cpu, fp32]"] and "| 42.00 ± 1.41 (n=2)" in rows["ER [cuda, bf16]"]
    assert "Ran on 4 machines" in rep.text
    assert "1 run(s) record no device" in rep.text
    # Paired within a machine only: cpu 50-40, 54-46 -> +9 (t 12.706 * se 1); cuda 60-41, 64-43 -> +20
    # (se 1). PBR [cuda, fp32] and the unknown run share one seed with nothing of their machine.
    paired = [line for line in rep.text.splitlines() if line.startswith("- PBR - ")]
    assert paired == ["- PBR - ER [cpu, fp32], buffer 200, Seq-CIFAR-10-LT (5 tasks): "
                      "Class-IL +9.00, 95% CI [-3.71, +21.71] (higher on 2 of n=2); "
                      "Task-IL +7.00, 95% CI [-5.71, +19.71] (higher on 2 of n=2)",
                      "- PBR - ER [cuda, bf16], buffer 200, Seq-CIFAR-10-LT (5 tasks): "
                      "Class-IL +20.00, 95% CI [+7.29, +32.71] (higher on 2 of n=2); "
                      "Task-IL +9.00, 95% CI [-3.71, +21.71] (higher on 2 of n=2)"]
    rows = {(g.method, g.device, g.precision): g for g in rep.groups}
    assert set(rows) == {("PBR", "cpu", "fp32"), ("PBR", "cuda", "bf16"), ("PBR", "cuda", "fp32"),
                         ("PBR", "unknown", "fp32"), ("ER", "cpu", "fp32"), ("ER", "cuda", "bf16")}
    assert [r.params["seed"] for r in rows["PBR", "cpu", "fp32"].runs] == ["0", "1", "2"]


def test_a_table_on_one_machine_says_where_and_keeps_plain_labels():
    p = {**BASE, "method.name": "pbr", "train.device": "auto", "train.precision": "bf16", "seed": "0"}
    # b: another table (IR 0.1), precision auto without its resolved tag and no device: unknown on both
    b = {**p, "train.precision": "auto", "data.imbalance_ratio": "0.1"}
    groups, _ = report.group_runs([RunRecord("a", p, {"class_il.acc": 25.0}, 0, {"pbr.device": "cuda"}),
                                   RunRecord("b", b, {"class_il.acc": 5.0})])
    first, second = report.render_markdown(groups).split("## ordered, IR 0.1\n")
    assert "Ran on cuda, bf16." in first and "| 200 | PBR | 25.00 (n=1) [paper 51.00]" in first
    assert "Ran on device unknown, precision unknown." in second and "| 200 | PBR | 5.00 (n=1)" in second
    assert "record no device" in second and "record no precision" in second and "record no" not in first


def _drawn(fig) -> dict[str, dict]:
    """What each panel of a report figure shows: its row labels, and the (x, y) points of each gid."""
    panels = {}
    for ax in fig.axes:
        if not ax.get_title():
            continue
        got = {"rows": [t.get_text() for t in ax.get_yticklabels()]}
        for line in ax.get_lines():
            got[line.get_gid()] = list(zip(line.get_xdata(), line.get_ydata()))
        for coll in ax.collections:
            got[coll.get_gid()] = [(float(s[0][0]), float(s[1][0]), float(s[0][1])) for s in coll.get_segments()]
        panels[ax.get_title()] = got
    return panels


def test_the_figure_draws_the_table_and_marks_the_papers_numbers(env):
    from stages.experiments.report_figures import SEED_OFFSET, table_figure

    rep = report.run(csv_path=None)
    (title, gs, paper), shuffled = report.figure_tables(rep.groups, "acc")
    assert (title, paper) == ("## ordered, IR 0.01", True)
    panels = _drawn(table_figure(title, gs, "acc", paper))
    assert set(panels) == {"Seq-CIFAR-10-LT (5 tasks): Class-IL", "Seq-CIFAR-10-LT (5 tasks): Task-IL"}
    c, t = panels["Seq-CIFAR-10-LT (5 tasks): Class-IL"], panels["Seq-CIFAR-10-LT (5 tasks): Task-IL"]
    assert c["rows"] == ["SGD", "ER · 200", "PBR (random) · 200", "PBR · 200"]  # the table's rows, in order
    assert c["mean"] == [(19, 0), (42, 1), (45, 2), (53, 3)]
    assert c["paper"] == [(19.62, 0), (39.14, 1), (44.77, 2), (51.00, 3)]
    assert t["paper"] == [(72.65, 0), (85.72, 1), (82.50, 2), (89.99, 3)]
    # PBR's three seeds beside its row, and its bar one std (sqrt 13) either side of 53
    assert sorted(x for x, y in c["seeds"] if y == 3 + SEED_OFFSET) == [50, 52, 57]
    (lo, hi, y), = [s for s in c["spread"] if s[2] == 3]
    assert math.isclose(lo, 53 - math.sqrt(13)) and math.isclose(hi, 53 + math.sqrt(13))
    # another metric: no paper marks, as the printed table has none
    (title, gs, paper), _ = report.figure_tables(rep.groups, "bwt")
    panels = _drawn(table_figure(title, gs, "bwt", paper))
    assert not paper and all("paper" not in p for p in panels.values())
    assert panels["Seq-CIFAR-10-LT (5 tasks): Class-IL"]["mean"] == [(-12, 3)]  # only PBR logged a BWT


def test_paper_marks_only_where_the_paper_has_a_number():
    """JOINT has no Task-IL number, PNN no Class-IL one, the proxy budget none. PBR at lr 0.03 is PBR
    as the paper ran it (every method at 0.03): its number, as the row at PBR's own lr has it."""
    from stages.experiments.report_figures import table_figure

    p = {**BASE, "seed": "0", "train.device": "cpu"}
    proxy = {"model.width": "8", "train.epochs": "[4, 8, 16, 40, 80]", "method.reservoir": "first_epoch"}
    runs = [RunRecord("j", {**p, "method.name": "joint"}, {"class_il.acc": 70.0, "task_il.acc": 90.0}),
            RunRecord("n", {**p, "method.name": "pnn"}, {"class_il.acc": 10.0, "task_il.acc": 80.0}),
            RunRecord("l", {**p, "method.name": "pbr", "train.lr": "0.03"}, {"class_il.acc": 40.0, "task_il.acc": 85.0}),
            RunRecord("x", {**p, **proxy, "method.name": "pbr"}, {"class_il.acc": 30.0, "task_il.acc": 75.0})]
    groups, _ = report.group_runs(runs)
    (full, fgs, fpaper), (proxy_title, pgs, ppaper) = report.figure_tables(groups, "acc")
    panels = _drawn(table_figure(full, fgs, "acc", fpaper))
    c, t = panels["Seq-CIFAR-10-LT (5 tasks): Class-IL"], panels["Seq-CIFAR-10-LT (5 tasks): Task-IL"]
    assert c["rows"] == ["JOINT", "PNN", "PBR (lr 0.03) · 200"]
    assert c["paper"] == [(70.36, 0), (51.00, 2)] and t["paper"] == [(84.72, 1), (89.99, 2)]
    assert c["mean"] == [(70, 0), (40, 2)]  # PNN's Class-IL is "-" in the table: nothing drawn
    assert (proxy_title, ppaper) == ("## ordered, IR 0.01 (proxy)", False)
    assert all("paper" not in p for p in _drawn(table_figure(proxy_title, pgs, "acc", ppaper)).values())


def test_one_png_per_table_written_atomically_and_logged_to_mlflow(env, tmp_path):
    from mlflow import MlflowClient

    from stages.experiments.report_figures import write_figures

    rep = report.run(figures_dir=tmp_path / "fig", log_mlflow=True)
    assert rep.figures == [tmp_path / "fig" / "ordered-ir-0.01-acc.png", tmp_path / "fig" / "shuffled-ir-0.1-acc.png"]
    assert sorted(p.name for p in (tmp_path / "fig").iterdir()) == [p.name for p in rep.figures]  # no temp file
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in rep.figures)
    client = MlflowClient(tracking_uri=env)
    run = client.get_run(rep.mlflow_run)
    assert client.get_experiment(run.info.experiment_id).name == "pbr-report" and run.info.status == "FINISHED"
    assert run.data.params["n_runs"] == "8" and run.data.tags["pbr.report.source"] == "pbr"
    assert sorted(f.path for f in client.list_artifacts(rep.mlflow_run, "figures")) == \
        ["figures/ordered-ir-0.01-acc.png", "figures/shuffled-ir-0.1-acc.png"]
    assert {f.path for f in client.list_artifacts(rep.mlflow_run)} >= {"report.md", "report.csv", "runs.csv"}
    # Every counted run, traceable from the report: its id, row and seed.
    rows = list(csv.DictReader(Path(client.download_artifacts(rep.mlflow_run, "runs.csv", str(tmp_path))).open()))
    assert sorted(r["run_id"] for r in rows) == sorted(r.run_id for g in rep.groups for r in g.runs)
    assert sorted(r["seed"] for r in rows if r["row"].startswith("PBR, buffer 200, Seq-CIFAR-10-LT")) == ["0", "1", "2"]
    # the report's own run is no row of the next report
    assert [len(g.runs) for g in report.run(csv_path=None).groups] == [len(g.runs) for g in rep.groups]
    # a table gone from the report takes its figure with it
    ordered = report.figure_tables(rep.groups, "acc")[:1]
    assert write_figures(ordered, "acc", tmp_path / "fig") == rep.figures[:1]
    assert sorted((tmp_path / "fig").iterdir()) == rep.figures[:1]


def test_a_store_that_refuses_the_report_run_is_a_warning(env, tmp_path, monkeypatch):
    def refuse(*a, **k):
        raise PermissionError("403 Forbidden")

    monkeypatch.setattr(report, "log_to_mlflow", refuse)
    rep = report.run(csv_path=tmp_path / "r.csv", log_mlflow=True)
    assert rep.mlflow_run is None and (tmp_path / "r.csv").is_file()
    (w,) = rep.warnings
    assert w.startswith("not logged to MLflow") and "MLFLOW_TRACKING_USERNAME" in w and "\n" not in w


def test_presets_read_as_one_word_and_old_spelled_out_runs_join_the_tuned_row():
    """params.yaml left PBR's open points auto when `method.preset` came in: a run from before, with
    the tuned values spelled out, is the same row as one that leaves them auto; the paper preset is a
    row of its own, named by the method, and only what departs from that preset is named beside it."""
    p = {**BASE, "method.name": "pbr", "model.width": "8", "train.epochs": "1", "train.lr": "auto"}
    spelled = {"method.pbr.tau1": "1.0", "method.pbr.buffer_order": "uncertain_weighted", "method.pbr.walk_candidate": "hold",
               "method.pbr.offset": "task", "method.pbr.mi_logits": "scaled", "method.pbr.kl_classes": "old"}
    auto = {k: "auto" for k in spelled}
    runs = [RunRecord("old", {**p, **spelled, "seed": "0"}, {"class_il.acc": 40.0}),
            RunRecord("new", {**p, **auto, "method.pbr.preset": "tuned", "seed": "1"}, {"class_il.acc": 44.0}),
            RunRecord("lit", {**p, **auto, "method.pbr.preset": "paper", "seed": "0"}, {"class_il.acc": 30.0}),
            RunRecord("lit-tau", {**p, **auto, "method.pbr.preset": "paper", "method.pbr.tau1": "1.0", "seed": "0"},
                      {"class_il.acc": 35.0}),
            RunRecord("rnd", {**p, **auto, "method.pbr.buffer_order": "random", "seed": "0"}, {"class_il.acc": 41.0})]
    groups, _ = report.group_runs(runs)
    rows = {g.method: g.stats("class_il", "acc") for g in groups}
    assert rows["PBR"] == (42.0, pytest.approx(2 * math.sqrt(2)), 2)
    assert rows["PBR (paper-literal)"][0] == 30.0 and rows["PBR (paper-literal, tau1 1.0)"][0] == 35.0
    # The paper's order (Ours - Random above Ours), then the readings.
    assert [g.method for g in sorted(groups, key=report._group_order)][:2] == ["PBR (random)", "PBR"]


def test_a_run_from_before_a_setting_existed_is_read_with_what_it_ran():
    """PODNet+ followed the PODNet paper's NCA at the full lr until `method.podnet.nca` and
    `method.podnet.lws_lr_factor` came in: a run that never recorded them is not the LT-CIL row."""
    p = {**BASE, "method.name": "podnet", "train.lr": "auto", "seed": "0", "method.podnet.pod_spatial": "3.0"}
    old, new = dict(p), {**p, "method.podnet.nca": "ltcil", "method.podnet.lws_lr_factor": "10.0"}
    assert report.method_label(new) == "PODNet+"
    assert report.method_label(old) == "PODNet+ (nca podnet_paper, lws_lr_factor 1.0)"


def test_runs_recorded_before_the_method_sections_join_todays_rows(tmp_path):
    """Runs recorded while every method key was flat (method.tau1, and all twenty methods' keys beside
    it) are read in today's spelling: an old PBR run at tau1 0.1 joins today's method.pbr.tau1 0.1
    row, and an old ER run's stray PBR keys do not split ER's row."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("pbr", artifact_location=(tmp_path / "a").as_uri())
    old_stray = {"method.tau1": "auto", "method.gamma": "auto", "method.alpha": "auto", "method.reservoir": "every_epoch"}
    _add_run(client, exp, {"method.name": "pbr", **old_stray, "method.tau1": "0.1", "seed": "0"},
             {"class_il.acc": 30}, "FINISHED", True, 1)
    _add_run(client, exp, {"method.name": "pbr", "method.reservoir": "every_epoch", "method.pbr.tau1": "0.1",
                           "seed": "1"}, {"class_il.acc": 34}, "FINISHED", True, 2)
    _add_run(client, exp, {"method.name": "er", **old_stray, "method.tau1": "0.5", "seed": "0"},
             {"class_il.acc": 20}, "FINISHED", True, 3)
    _add_run(client, exp, {"method.name": "er", "method.reservoir": "every_epoch", "seed": "1"},
             {"class_il.acc": 24}, "FINISHED", True, 4)
    runs = report.collect_runs(uri)
    assert not any({"method.tau1", "method.gamma"} & r.params.keys() for r in runs)
    groups, _ = report.group_runs(runs)
    rows = {g.method: g.stats("class_il", "acc") for g in groups}
    assert rows == {"PBR (tau1 0.1)": (32.0, pytest.approx(2 * math.sqrt(2)), 2),
                    "ER": (22.0, pytest.approx(2 * math.sqrt(2)), 2)}


def test_a_run_off_its_methods_lr_milestones_is_a_row_of_its_own(tmp_path):
    """On CIFAR-100 ER's own setting carries Mammoth's lr milestones (0.7, 0.9): a run at a constant lr,
    set so or recorded before the key existed (it trained at a constant lr then), or at other
    milestones, is a variant row, not pooled with ER's. On CIFAR-10 ER's own lr is constant: the old
    runs stay in ER's row."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("pbr", artifact_location=(tmp_path / "a").as_uri())
    er = {"method.name": "er", "data.dataset": "cifar100", "method.buffer_size": "500", "train.lr": "auto"}
    _add_run(client, exp, {**er, "seed": "0"}, {"class_il.acc": 20}, "FINISHED", True, 1,
             tags={"resolved.lr": "0.1"})  # recorded before the key
    _add_run(client, exp, {**er, "train.lr_milestones": "auto", "seed": "1"}, {"class_il.acc": 30}, "FINISHED", True, 2,
             tags={"resolved.lr": "0.1", "resolved.lr_milestones": "[0.7, 0.9]"})
    _add_run(client, exp, {**er, "train.lr_milestones": "[0.7, 0.9]", "seed": "2"}, {"class_il.acc": 32}, "FINISHED",
             True, 3)
    _add_run(client, exp, {**er, "train.lr_milestones": "[]", "seed": "3"}, {"class_il.acc": 22}, "FINISHED", True, 4)
    _add_run(client, exp, {**er, "train.lr_milestones": "[0.5]", "seed": "0"}, {"class_il.acc": 25}, "FINISHED", True, 5)
    cifar10 = {**er, "data.dataset": "cifar10"}
    _add_run(client, exp, {**cifar10, "seed": "0"}, {"class_il.acc": 40}, "FINISHED", True, 6)
    _add_run(client, exp, {**cifar10, "train.lr_milestones": "auto", "seed": "1"}, {"class_il.acc": 44}, "FINISHED",
             True, 7)
    groups, _ = report.group_runs(report.collect_runs(uri))
    rows = {(g.dataset, g.method): sorted(r.params["seed"] for r in g.runs) for g in groups}
    assert rows == {("cifar100", "ER"): ["1", "2"], ("cifar100", "ER (constant lr)"): ["0", "3"],
                    ("cifar100", "ER (lr milestones 0.5)"): ["0"], ("cifar10", "ER"): ["0", "1"]}
    # at buffer 200 as at 500 (best_args has no 200: ER takes 500's lr and milestones)
    at_200 = {**BASE, **er, "method.buffer_size": "200"}
    assert report.method_label({**at_200, "train.lr_milestones": "[0.7, 0.9]"}) == "ER"
    assert report.method_label({**at_200, "train.lr": "0.03", "train.lr_milestones": "[]"}) == "ER (lr 0.03, constant lr)"


def test_a_run_from_before_data_subset_reads_as_the_seeded_subset_it_used(tmp_path):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("pbr", artifact_location=(tmp_path / "a").as_uri())
    pbr = {"method.name": "pbr", "seed": "0"}
    _add_run(client, exp, pbr, {"class_il.acc": 40}, "FINISHED", True, 1)  # recorded before the key
    _add_run(client, exp, {**pbr, "data.subset": "seeded"}, {"class_il.acc": 42}, "FINISHED", True, 2)
    (g,), _ = report.group_runs(report.collect_runs(uri))
    # the same settings: a repeat (the newest kept), not two settings averaged
    assert [r.metrics["class_il.acc"] for r in g.runs] == [42] and not any("differ" in n for n in g.notes)
    _add_run(client, exp, {**pbr, "seed": "1", "data.subset": "ldam"}, {"class_il.acc": 44}, "FINISHED", True, 3)
    (g,), _ = report.group_runs(report.collect_runs(uri))
    assert any("differ in data.subset (ldam, seeded)" in n for n in g.notes)


def test_report_marks_killed_what_a_dead_stage_left_running(tmp_path):
    """A stage marks its host's dead runs KILLED as it starts, but a pipeline DVC restores from its
    cache starts no stage: a killed prepare's run stayed RUNNING."""
    import socket
    import subprocess
    import sys

    from mlflow import MlflowClient

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("pbr", artifact_location=(tmp_path / "a").as_uri())
    host = socket.gethostname()
    killed = client.create_run(exp, tags={"pbr.host": host, "pbr.pid": str(dead.pid)}).info.run_id
    going = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # a stage still running
    alive = client.create_run(exp, tags={"pbr.host": host, "pbr.pid": str(going.pid)}).info.run_id
    elsewhere = client.create_run(exp, tags={"pbr.host": host + "-other", "pbr.pid": str(dead.pid)}).info.run_id
    try:
        report.run(tracking_uri=uri, csv_path=None)
    finally:
        going.kill()
        going.wait()
    status = {r: client.get_run(r).info.status for r in (killed, alive, elsewhere)}
    assert status == {killed: "KILLED", alive: "RUNNING", elsewhere: "RUNNING"}


def test_a_run_without_a_seed_is_left_out_and_auto_threads_are_what_the_run_had():
    """A run with no seed param joined its cell as one pseudo-seed ""; two `train.threads: auto` runs
    of one seed on 1 and 2 threads (which move a CPU run's last digits) read as a repeat, and the
    older was dropped."""
    p = {**BASE, "method.name": "pbr"}
    groups, skipped = report.group_runs([RunRecord("noseed", p, {"class_il.acc": 90.0, "task_il.acc": 90.0})])
    assert not groups and skipped == ["run noseed left out: param 'seed' missing or not a number"]
    runs = [RunRecord(f"t{n}", report.pin_auto({**p, "seed": "0", "train.threads": "auto"}, {"pbr.threads": str(n)}),
                      {"class_il.acc": acc, "task_il.acc": 80.0}, n) for n, acc in ((1, 44.74), (2, 44.89))]
    (g,), _ = report.group_runs(runs)
    assert len(g.runs) == 2 and g.by_seed("class_il", "acc") == {"0": pytest.approx((44.74 + 44.89) / 2)}
    assert any("differ in train.threads (1, 2)" in n for n in g.notes)
    # On a GPU an auto run's threads follow how many runs shared the machine and change nothing: a
    # re-queued run is a repeat, counted once (the newer).
    gpu = [RunRecord(f"g{n}", report.pin_auto({**p, "seed": "0", "train.threads": "auto"},
                                              {"pbr.threads": str(n), "pbr.device": "cuda"}),
                     {"class_il.acc": acc, "task_il.acc": 80.0}, t, {"pbr.device": "cuda"})
           for t, (n, acc) in enumerate(((16, 50.0), (4, 52.0)))]
    (g,), _ = report.group_runs(gpu)
    assert [r.run_id for r in g.runs] == ["g4"] and g.by_seed("class_il", "acc") == {"0": 52.0}
    # A run resumed on another count (an explicit train.threads changed between tries) is no run of
    # either count: its tasks' counts are its setting.
    mixed = report.pin_auto({**p, "seed": "0", "train.threads": "1"}, {"pbr.threads": "2,2,2,1,1"})
    assert mixed["train.threads"] == "2,2,2,1,1"


def test_hals_ring_reads_the_reservoirs_rule_as_its_reservoir_does():
    """The per-task ring is offered the batches `method.reservoir` says, as the reservoir is (its
    buffer differs: tests/test_rehearsal_methods.py): HAL runs of either memory that differ only in
    it are not one row, and a full-width run offered the first epoch only is not the full protocol."""
    for memory in ("ring", "reservoir"):
        run = {**BASE, "method.name": "hal", "seed": "0", "method.hal.hal_memory": memory}
        assert report.budget_of({**run, "method.reservoir": "every_epoch"}) == "full protocol"
        assert report.budget_of({**run, "method.reservoir": "first_epoch"}) == "width 64, epochs 50, reservoir first_epoch"
        proxy = {**run, "model.width": "8", "train.epochs": "[4, 8, 16, 40, 80]"}
        assert report.budget_of({**proxy, "method.reservoir": "first_epoch"}) == "proxy"
        assert report.budget_of({**proxy, "method.reservoir": "every_epoch"}) != "proxy"


def test_an_integer_setting_reads_as_an_integer_in_a_row_label():
    """The report reads every number as a float to compare them ("T 3.0" in the label of a PBR run at
    method.pbr.mc_samples 3)."""
    p = {**BASE, "method.name": "pbr", "seed": "0"}
    assert report.method_label({**p, "method.pbr.mc_samples": "3"}) == "PBR (T 3)"
    assert report.method_label({**p, "method.pbr.mi_epochs": "5"}) == "PBR (MI over 5 epochs)"
    assert report.method_label({**p, "method.pbr.tau2": "3"}) == "PBR (tau2 3.0)"  # a float setting stays one


def test_a_moved_stores_report_run_keeps_its_files_beside_it(env, tmp_path):
    """MLflow keeps the report experiment's artifact folder as an absolute path: in a copy of the
    checkout (store and all) the report's files went into the original's mlartifacts/."""
    import shutil

    from mlflow import MlflowClient

    first = report.run(csv_path=None, log_mlflow=True)
    old = Path(env.removeprefix("sqlite:///")).parent
    copy = tmp_path / "copied checkout"
    copy.mkdir()
    shutil.copy(old / "mlflow.db", copy / "mlflow.db")
    shutil.copytree(old / "mlartifacts", copy / "mlartifacts")
    uri = f"sqlite:///{copy / 'mlflow.db'}"
    rep = report.run(tracking_uri=uri, csv_path=None, log_mlflow=True)
    client = MlflowClient(uri)
    assert client.get_run(rep.mlflow_run).info.artifact_uri.startswith((copy / "mlartifacts").as_uri() + "/")
    assert {f.path for f in client.list_artifacts(first.mlflow_run)} >= {"report.md"}  # the copied ones found too


def test_a_nan_metric_reads_as_missing_with_a_note_not_a_crash():
    """An imported or hand-logged run with a NaN (training itself refuses a non-finite loss): the
    statistics module raised AttributeError on it in the table, the paired lines and pbr confirm."""
    from stages.experiments import confirmation

    runs = [RunRecord(f"pbr-{s}", {**BASE, "method.name": "pbr", "seed": str(s)},
                      {"class_il.acc": v, "task_il.acc": 80.0}, 0, {"pbr.device": "cpu"})
            for s, v in ((0, 50.0), (1, float("nan")), (2, 54.0))]
    runs += [RunRecord(f"er-{s}", {**BASE, "method.name": "er", "seed": str(s)},
                       {"class_il.acc": v, "task_il.acc": 80.0}, 0, {"pbr.device": "cpu"})
             for s, v in ((0, 40.0), (1, 41.0), (2, float("inf")))]
    groups, _ = report.group_runs(runs)
    text = report.render_markdown(groups)
    assert "52.00 ± 2.83" in text  # PBR: 50 and 54; ER: 40 and 41
    assert "run pbr-1's class_il.acc not finite, left out of its cells" in text and "run er-2's class_il.acc" in text
    # A scoring's NaN is no cell of the tables: no note (JOINT's runs all have one).
    runs[0].metrics["score.mi_kept"] = float("nan")
    assert "score.mi_kept" not in report.render_markdown(report.group_runs(runs)[0])
    # PBR - ER over the one seed both have a finite value on (seed 0): too few to pair.
    (pbr,) = [g for g in groups if g.method == "PBR"]
    assert pbr.by_seed("class_il", "acc") == {"0": 50.0, "2": 54.0}
    confirmation.render(groups)  # no crash on the same runs


def test_a_confirmations_seeds_averaged_with_others_are_pointed_out():
    """Selection seeds (a setting was chosen on them) pooled with a confirmation's fresh ones read
    better than the confirmation alone: the note says so and how to see the fresh ones alone."""
    runs = [RunRecord(f"pbr-{s}", {**BASE, "method.name": "pbr", "seed": str(s)}, {"class_il.acc": 50.0}, 0,
                      {"pbr.device": "cpu"}) for s in (*range(0, 10), *range(100, 110))]
    runs += [RunRecord(f"er-{s}", {**BASE, "method.name": "er", "seed": str(s)}, {"class_il.acc": 40.0}, 0,
                       {"pbr.device": "cpu"}) for s in range(100, 110)]
    text = report.render_markdown(report.group_runs(runs)[0])
    assert ("PBR, buffer 200, Seq-CIFAR-10-LT (5 tasks): seeds 0-9 averaged with a pre-registered confirmation's "
            "100-109 (docs/preregistration.md); those alone: `pbr report --seeds 100-109`") in text
    assert "ER, buffer 200, Seq-CIFAR-10-LT (5 tasks): seeds" not in text  # ER ran the fresh seeds only
    assert text.count("averaged with a pre-registered") == 1  # one note for the cell
    assert report.seed_text(["5", "0", "1", "2", "200", "201", "7"]) == "0-2, 5, 7, 200-201"


def test_two_confirmations_fresh_seeds_pooled_get_no_selection_note():
    """Seeds 100-102 and 200-202 are both fresh (two confirmations' blocks, no choice made on either):
    the row once got four notes, each calling one block the other's selection seeds. Add a
    selection seed and the cell gets one note naming both blocks."""
    def runs(seeds):
        return [RunRecord(f"pbr-{s}", {**BASE, "method.name": "pbr", "seed": str(s)}, {"class_il.acc": 50.0}, 0,
                          {"pbr.device": "cpu"}) for s in seeds]

    fresh = (100, 101, 102, 200, 201, 202)
    text = report.render_markdown(report.group_runs(runs(fresh))[0])
    assert "averaged with" not in text and "pbr report --seeds" not in text
    text = report.render_markdown(report.group_runs(runs((3, *fresh)))[0])
    notes = [line for line in text.splitlines() if "averaged with" in line]
    assert notes == ["- note: PBR, buffer 200, Seq-CIFAR-10-LT (5 tasks): seeds 3 averaged with pre-registered "
                     "confirmations' 100-109 and 200-209 (docs/preregistration.md); each alone: "
                     "`pbr report --seeds 100-109` or `pbr report --seeds 200-209`"]


def test_output_paths_of_the_wrong_kind_are_refused_before_anything_is_written(env, tmp_path):
    """--figures naming a file was found after the CSV was rewritten; --csv naming a folder failed
    naming a temporary file that no longer existed."""
    (tmp_path / "old.csv").write_text("old")
    (tmp_path / "notes.md").write_text("mine")
    with pytest.raises(UserError, match=r"^--figures .*notes.md: a file is there; give a folder's path$"):
        report.run(csv_path=tmp_path / "old.csv", figures_dir=tmp_path / "notes.md")
    assert (tmp_path / "old.csv").read_text() == "old"
    (tmp_path / "folder").mkdir()
    with pytest.raises(UserError, match=r"^--csv .*folder: a folder is there; give a file's path$"):
        report.run(csv_path=tmp_path / "folder")
    from stages.runtime import artifacts

    with pytest.raises(UserError, match=r"folder is a folder; give a file's path$"):
        artifacts.write_text(tmp_path / "folder", "x")


def test_from_a_subfolder_the_report_reads_and_writes_the_repositorys(env, tmp_path, pbr_main):
    """`pbr report` in docs/ of a DVC project: the repository's store (tracking.tracking_uri) and its
    reports/ folder, not a reports/ made in docs/."""
    (tmp_path / ".dvc").mkdir()
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    (tmp_path / "docs").mkdir()
    r = pbr_main("report", "--no-log", cwd=tmp_path / "docs", env={"MLFLOW_TRACKING_URI": env})
    assert r.returncode == 0 and "## ordered, IR 0.01" in r.stdout, r.stderr
    assert (tmp_path / "reports" / "report.csv").is_file() and not (tmp_path / "docs" / "reports").exists()
    assert f"wrote {tmp_path / 'reports' / 'report.csv'}" in r.stderr


def test_eval_batch_size_keeps_runs_apart_and_paper_lr_rows_show_the_paper():
    """PBR's walk draws MC-dropout masks a batch at a time: two seed-0 runs at different
    train.eval_batch_size are two runs (not a repeat, the older dropped). A row at the paper's lr
    carries the paper's number in the markdown as in the CSV."""
    p = {**BASE, "method.name": "pbr", "seed": "0"}
    runs = [RunRecord("bs128", {**p, "train.eval_batch_size": "128"}, {"class_il.acc": 45.0}, 1),
            RunRecord("bs256", {**p, "train.eval_batch_size": "256"}, {"class_il.acc": 41.0}, 2)]
    (g,), _ = report.group_runs(runs)
    assert sorted(r.run_id for r in g.runs) == ["bs128", "bs256"]
    assert any("train.eval_batch_size (128, 256)" in n for n in g.notes)

    er = {**BASE, "method.name": "er", "seed": "0"}
    runs = [RunRecord("er", {**er, "train.lr": "0.1"}, {"class_il.acc": 40.0, "task_il.acc": 85.0}, 1),
            RunRecord("er03", {**er, "train.lr": "0.03"}, {"class_il.acc": 35.0, "task_il.acc": 80.0}, 2)]
    groups, _ = report.group_runs(runs)
    assert {g.method for g in groups} == {"ER", "ER (lr 0.03)"}
    text = report.render_markdown(groups, "acc", [])
    paper = PAPER_RESULTS["ordered", 0.01, "cifar10", "ER", 200]
    row = next(line for line in text.splitlines() if line.startswith("| 200 | ER (lr 0.03) |"))
    assert f"{paper[0]:.2f}" in row and f"{paper[1]:.2f}" in row, row


def test_joint_runs_recorded_with_a_bwt_show_none():
    """JOINT runs evaluated before the method said it has no BWT or forgetting carry them in the
    store: the report leaves them out too (a row mixing old and new runs averaged the old ones)."""
    p = {**BASE, "method.name": "joint", "seed": "0"}
    runs = [RunRecord("old", p, {"class_il.acc": 60.0, "class_il.bwt": 42.5, "class_il.forgetting": -42.5}, 1),
            RunRecord("new", {**p, "seed": "1"}, {"class_il.acc": 62.0}, 2)]
    (g,), _ = report.group_runs(runs)
    assert g.stats("class_il", "bwt") is None and g.stats("class_il", "forgetting") is None
    assert g.stats("class_il", "acc")[0] == 61.0


def test_a_papers_mark_stands_only_beside_runs_of_its_task_count():
    """The paper's Seq-CIFAR-100-LT has 10 tasks: beside 5-task runs its diamond read as a
    like-for-like comparison (the table says "[paper x, 10 tasks]" there)."""
    from stages.experiments.report_figures import table_figure

    p = {**BASE, "seed": "0", "train.device": "cpu", "method.name": "er", "data.dataset": "cifar100"}
    for n_tasks, marked in (("5", False), ("10", True)):
        groups, _ = report.group_runs([RunRecord("r", {**p, "data.n_tasks": n_tasks},
                                                 {"class_il.acc": 20.0, "task_il.acc": 60.0})])
        (title, gs, paper), = report.figure_tables(groups, "acc")
        panels = _drawn(table_figure(title, gs, "acc", paper))
        assert all(("paper" in panel) == marked for panel in panels.values()), (n_tasks, panels)


def test_the_forgetting_table_says_its_definition_and_which_way_is_better():
    """Forgetting differs from Mammoth's (the final row left out of the max) and lower is better, so a
    positive PBR - ER is PBR forgetting more: the page says both, the accuracy page neither."""
    runs = [RunRecord(f"{m}{s}", {**BASE, "method.name": m, "seed": str(s)},
                      {"class_il.acc": 30.0 + s, "class_il.forgetting": f + s, "task_il.acc": 80.0,
                       "task_il.forgetting": 5.0 + s}, 0)
            for m, f in (("pbr", 40.0), ("er", 30.0)) for s in (0, 1, 3)]
    groups, _ = report.group_runs(runs)
    text = report.render_markdown(groups, "forgetting")
    assert "Chaudhry et al. 2018" in text and "never below ours" in text
    assert "a positive difference is PBR forgetting more" in text
    # PBR - ER: +10 on each seed, so higher on 3 of 3, an interval of width 0
    assert "Class-IL +10.00, 95% CI [+10.00, +10.00] (higher on 3 of n=3)" in text
    acc = report.render_markdown(groups, "acc")
    assert "Chaudhry" not in acc and "forgetting more" not in acc


def test_runs_logging_their_resolved_settings_as_params_group_as_before(tmp_path):
    """The train stage logs each resolved value as a param `resolved.*` too (MLflow's charts read
    params): those are not settings of their own. Two seeds of one cell, and a seed run again before
    and after the params existed, stay one row with no note of differing settings (resolved.seed
    differed between seeds, and split the new runs from the old)."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("pbr", artifact_location=(tmp_path / "a").as_uri())
    for t, seed, acc, new in ((1, "0", 30, False), (2, "0", 32, True), (3, "1", 36, True)):
        extra = {"resolved.seed": seed, "resolved.lr": "0.03", "resolved.head": "cosine"} if new else {}
        _add_run(client, exp, {"method.name": "pbr", "seed": seed, **extra}, {"class_il.acc": acc}, "FINISHED", True, t,
                 tags={"resolved.seed": seed, "resolved.lr": "0.03", "resolved.head": "cosine"})
    groups, _ = report.group_runs(report.collect_runs(uri))
    [g] = groups
    # Seed 0's newer run replaces its older one: (32 + 36) / 2, over two seeds.
    assert g.stats("class_il", "acc") == (34.0, pytest.approx(2 * math.sqrt(2)), 2)
    assert not any("differ" in n for n in g.notes), g.notes


def test_a_tied_seed_is_not_one_pbr_is_higher_on():
    """docs/report.md: k is how many seeds PBR scored higher. Differences +2 and 0: mean 1, sd sqrt 2,
    se 1, t_{0.975,1} = 12.706: [-11.71, +13.71]; higher on 1 of 2 (the tie is not a win)."""
    p = report._paired({"0": 52.0, "1": 50.0}, {"0": 50.0, "1": 50.0})
    assert (p.wins, p.n, p.mean) == (1, 2, 1.0)
    assert p.text() == "+1.00, 95% CI [-11.71, +13.71] (higher on 1 of n=2)"


def test_runs_of_another_number_of_tasks_are_a_column_of_their_own():
    """5-task and 10-task runs of one cell measure different things (docs/report.md names the CSV row
    by its n_tasks): never averaged; 30 and 34 over the 5-task seeds, 10 alone over 10 tasks."""
    p = {**BASE, "method.name": "er"}
    runs = [RunRecord("a", {**p, "seed": "0"}, {"class_il.acc": 30.0}),
            RunRecord("b", {**p, "seed": "1"}, {"class_il.acc": 34.0}),
            RunRecord("c", {**p, "seed": "0", "data.n_tasks": "10"}, {"class_il.acc": 10.0})]
    groups, _ = report.group_runs(runs)
    by = {g.n_tasks: g.stats("class_il", "acc") for g in groups}
    assert by == {5: (32.0, pytest.approx(2 * math.sqrt(2)), 2), 10: (10.0, 0.0, 1)}
    assert "Seq-CIFAR-10-LT (10 tasks) Class-IL" in report.render_markdown(groups)


def test_each_modes_n_counts_its_seeds_not_the_rows_runs():
    """docs/report.md: class_il_n / task_il_n are each mode's own number of seeds. Seed 1 has two runs
    of differing settings (counted once), seed 2 logged no Task-IL: 4 runs, 3 seeds, Class-IL over 3,
    Task-IL over 2."""
    p = {**BASE, "method.name": "er"}
    runs = [RunRecord("0", {**p, "seed": "0"}, {"class_il.acc": 30.0, "task_il.acc": 70.0}),
            RunRecord("1", {**p, "seed": "1"}, {"class_il.acc": 34.0, "task_il.acc": 72.0}),
            RunRecord("1b", {**p, "seed": "1", "train.batch_size": "16"}, {"class_il.acc": 38.0, "task_il.acc": 74.0}),
            RunRecord("2", {**p, "seed": "2"}, {"class_il.acc": 20.0})]
    (row,) = report.csv_rows(report.group_runs(runs)[0])
    assert (row["n_runs"], row["n_seeds"], row["class_il_n"], row["task_il_n"]) == ("4", "3", "3", "2")
    assert (row["class_il_mean"], row["task_il_mean"]) == ("28.6667", "71.5000")  # (30+36+20)/3, (70+73)/2


def test_fewer_epochs_at_the_full_width_is_not_the_full_protocol():
    """The full protocol is params.yaml's width and epochs both: 5 epochs at width 64 is a budget of
    its own, with no paper number beside it."""
    p = {**BASE, "method.name": "pbr", "seed": "0"}
    (g,) = report.group_runs([RunRecord("short", {**p, "train.epochs": "5"}, {"class_il.acc": 20.0})])[0]
    assert g.budget == "width 64, epochs 5"
    assert "[paper" not in report.render_markdown([g])


def test_a_method_without_a_buffer_repeats_a_seed_whatever_its_buffer_size():
    """SGD does not read method.buffer_size: its runs of one seed at buffers 200 and 500 are one run
    repeated (the newest, 21, counts), not two settings averaged (20.5) with a note."""
    p = {**BASE, "method.name": "sgd", "seed": "0"}
    runs = [RunRecord("old", {**p, "method.buffer_size": "200"}, {"class_il.acc": 20.0}, 1),
            RunRecord("new", {**p, "method.buffer_size": "500"}, {"class_il.acc": 21.0}, 2)]
    (g,) = report.group_runs(runs)[0]
    assert [r.run_id for r in g.runs] == ["new"] and g.stats("class_il", "acc") == (21.0, 0.0, 1)
    assert not any("differ" in n for n in g.notes)
