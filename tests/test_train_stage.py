"""The train stage in-process on small generated data: every method, determinism, starting over.

`dvc repro` of the same stage (and its kills and resumes) is in test_pipeline_dvc / test_faults_dvc;
here the stage's own behaviour is checked without paying process start-up per run."""

import json
import subprocess
import sys
from pathlib import Path
import shutil

import pytest
import yaml

import fakedata
from pbr.methods import METHODS
from project import tree_bytes
from stages.pipeline import trained
from stages.runtime.config import from_dict

SMALL = {"data": {"download": False, "imbalance_ratio": 0.1}, "model": {"width": 4},
         "train": {"epochs": 1, "device": "cpu", "precision": "fp32", "eval_batch_size": 256}, "method": {"pbr": {"mc_samples": 4}}}


def _cfg(raw, **sections):
    d = {k: dict(v) for k, v in SMALL.items()}
    d["data"]["root"] = str(raw)
    for section, values in sections.items():
        d.setdefault(section, {}).update(values)
    return from_dict(d)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    from stages.pipeline import prepare

    root = tmp_path_factory.mktemp("prepared")
    fakedata.write_cifar(root / "raw", 10, 60, 6)
    import os

    cwd = os.getcwd()
    os.chdir(root)
    try:
        prepare.run(_cfg(root / "raw"), log=lambda *_: None)
    finally:
        os.chdir(cwd)
    return root


@pytest.fixture
def workdir(tmp_path, prepared, monkeypatch):
    shutil.copytree(prepared / "data", tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _train(cfg):
    from stages.pipeline import train

    lines = []
    summary = train.run(cfg, log=lines.append)
    return summary, "\n".join(lines)


# PBR filled by the online reservoir (method.pbr.sampling) keeps other state than its walk: resumed too.
VARIANTS = {"pbr+reservoir": {"name": "pbr", "pbr": {"mc_samples": 4, "sampling": "reservoir"}}}


@pytest.mark.parametrize("name", [*METHODS, *VARIANTS])
def test_every_method_trains_saves_each_task_and_resumes_to_the_same_bytes(workdir, prepared, name, monkeypatch):
    """Also what a killed run needs of each method: its saved tasks rebuild it (the score and evaluate
    stages' way in) and resume to the bytes of the uninterrupted run. A real SIGKILL between processes
    is in test_methods_dvc (a few methods) and test_faults_dvc (PBR)."""
    import functools

    import torch

    from pbr.methods import hal

    # HAL learns each anchor in 100 SGD steps (Mammoth's); 3 make anchors just as well for a resume to
    # reproduce, at a tenth of this test's time.
    monkeypatch.setattr(hal, "learn_anchor", functools.partial(hal.learn_anchor, steps=3))

    from pbr.data.shards import load_manifest
    from pbr.loop import evaluate
    from stages.pipeline import train

    cfg = _cfg(prepared / "raw", method=VARIANTS.get(name, {"name": name}))
    name = cfg.method.name
    summary, _ = _train(cfg)
    assert summary["settings"]["method"] == name
    m = summary["class_il"]["matrix"]
    assert len(m) == 5 and all(len(r) == 5 for r in m)
    for k in range(5):
        task = workdir / f"artifacts/train/task_{k:02d}"
        assert (task / "model.pt").is_file() and (task / "state.pt").is_file()
        assert (task / "buffer.parquet").is_file() == METHODS[name].uses_buffer
        # A task not learned yet is not evaluated (null), the tasks learned are, in both scenarios.
        for scen in ("class_il", "task_il"):
            row = summary[scen]["matrix"][k]
            assert row[k + 1:] == [None] * (4 - k) and all(isinstance(v, float) for v in row[: k + 1])
        saved = json.loads((task / "accuracy.json").read_text())
        assert saved["class_il"] == m[k] and saved["task_il"] == summary["task_il"]["matrix"][k]
    # Task-IL is Class-IL restricted to the task's classes: never below it on a seen task (PNN's
    # Class-IL row is another column's answers)
    assert not METHODS[name].class_il or all(t >= c - 1e-9 for k in range(5) for c, t in zip(summary["class_il"]["matrix"][k][:k + 1],
                                                             summary["task_il"]["matrix"][k][:k + 1]))
    if METHODS[name].uses_buffer:
        import pyarrow.parquet as pq

        buf = pq.read_table(workdir / "artifacts/train/task_04/buffer.parquet")
        # Full, except a per-class quota (iCaRL) leaves the slots of classes with fewer samples empty.
        assert 0 < buf.num_rows <= 200
        assert set(buf.column_names) == {"image", "label", "task", "score", "logits"}

    manifest = load_manifest(workdir / "data/prepared")
    _, tests = train._load_tasks(manifest, torch.device("cpu"))
    method, saved = trained.load_method(workdir / "artifacts/train/task_02/model.pt", manifest, torch.device("cpu"),
                                      torch.Generator().manual_seed(0))
    assert saved["task"] == 2 and type(method) is METHODS[name]
    assert list(evaluate(method, tests[:3], 3, 256)) == [summary["class_il"]["matrix"][2][:3],
                                                         summary["task_il"]["matrix"][2][:3]]

    out = workdir / "artifacts/train"
    whole = tree_bytes(out)
    shutil.rmtree(out / "task_03")
    shutil.rmtree(out / "task_04")
    (out / "accuracy.json").unlink()
    # as once the run's scoring began: its resume store would give the two tasks back whole
    from stages.runtime import resume

    resume.forget(json.loads((out / "run.json").read_text())["fingerprint"])
    again, log = _train(cfg)
    assert "resuming after task 3 of 5" in log
    assert again == summary and tree_bytes(out) == whole


def test_a_run_under_lr_milestones_records_them_and_resumes_to_the_same_bytes(workdir, prepared):
    """A run resumes after a finished task only, and each task's optimiser starts afresh with its lr set
    from the epoch alone: the resumed tasks train at the uninterrupted run's lrs, to its bytes. The
    resolved milestones and their source are recorded where lr's are (run.json, the MLflow tags)."""
    from stages.runtime.run_settings import trained_tags
    from stages.pipeline.train import settings
    from stages.runtime import resume

    cfg = _cfg(prepared / "raw", method={"name": "er"}, train={"epochs": 2, "lr_milestones": [0.5]})
    summary, _ = _train(cfg)
    out = workdir / "artifacts/train"
    record = json.loads((out / "run.json").read_text())
    assert record["settings"]["lr_milestones"] == [0.5] and record["params"]["train.lr_milestones"] == [0.5]
    tags = trained_tags(record)
    assert tags["resolved.lr_milestones"] == [0.5] and "source.lr_milestones" not in tags  # given in params
    auto = settings(_cfg(prepared / "raw", method={"name": "er"}))  # CIFAR-10: Mammoth schedules none
    assert auto.values["lr_milestones"] == [] and "common protocol" in auto.tags()["source.lr_milestones"]
    whole = tree_bytes(out)
    shutil.rmtree(out / "task_03")
    shutil.rmtree(out / "task_04")
    (out / "accuracy.json").unlink()
    resume.forget(record["fingerprint"])
    again, log = _train(cfg)
    assert "resuming after task 3 of 5" in log
    assert again == summary and tree_bytes(out) == whole


def test_same_seed_same_bytes_and_changed_settings_start_over(workdir, prepared):
    cfg = _cfg(prepared / "raw", method={"name": "er"})
    first, _ = _train(cfg)
    files = {p: p.read_bytes() for p in sorted((workdir / "artifacts/train").rglob("*")) if p.is_file()}
    shutil.rmtree(workdir / "artifacts/train")
    again, _ = _train(cfg)
    assert again == first
    assert {p: p.read_bytes() for p in files} == files  # models, buffers and states byte for byte

    # A finished run with the same settings trains nothing new.
    _, log = _train(cfg)
    assert "resuming after task 5 of 5" in log
    # Other settings: the saved tasks are not resumed.
    changed, log = _train(_cfg(prepared / "raw", method={"name": "er"}, train={"lr": 0.05}))
    assert "starting over" in log and changed["settings"]["lr"] == 0.05


def test_starting_over_names_what_changed(workdir, prepared, monkeypatch):
    """An edit of the training code (a new method's file in pbr/methods too) retrains every run: the
    line says so, with the hashes run.json holds, rather than leave the user to guess a setting."""
    from stages.pipeline import train

    _train(_cfg(prepared / "raw", method={"name": "sgd"}))  # at lr 0.1, Mammoth's best on CIFAR-10
    _, log = _train(_cfg(prepared / "raw", method={"name": "sgd"}, train={"lr": 0.05}))
    assert "artifacts/train: settings changed (lr 0.1 -> 0.05) since the saved tasks; starting over" in log
    before = json.loads((workdir / "artifacts/train/run.json").read_text())["code_sha256"]
    monkeypatch.setattr(train, "code_hash", lambda: "7ad97255" + "0" * 56)
    _, log = _train(_cfg(prepared / "raw", method={"name": "sgd"}, train={"lr": 0.05}))
    assert (f"artifacts/train: code changed (code_sha256 {before[:8]} -> 7ad97255, the hash of pbr/methods, "
            "pbr/memory, pbr/models, ...: any edit there, a new method's file too) since the saved tasks; "
            "starting over") in log


def test_cuda_requested_without_a_gpu_is_a_clear_error(workdir, prepared):
    import torch

    from pbr.errors import UserError

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(UserError, match="train.device = cuda but no CUDA device is visible; use auto or cpu"):
        _train(_cfg(prepared / "raw", train={"device": "cuda"}))
    assert not (workdir / "artifacts").exists()


def test_compiled_model_trains_like_the_eager_one():
    """torch.compile's capture of our network and a method's step (dynamo, then AOTAutograd's forward
    and backward graphs): where our code can break compile. The backend is aot_eager, not the
    inductor that `train.compile: true` uses: inductor's kernels are torch's to test, and on CI's
    fresh machine their first compile is 37 C++ builds, about 50 CPU s (8 with aot_eager, machine B)."""
    import torch

    from pbr.methods import Context, create
    from pbr.models import Net

    def one_step(compiled):
        net = Net(10, 8, "cosine", dropout=0.0, generator=torch.Generator().manual_seed(0))
        if compiled:
            net.compile(backend="aot_eager")
        ctx = Context(10, [torch.arange(0, 2), torch.arange(2, 4)], torch.device("cpu"), lambda x, g: x.float() / 255,
                      lambda x: x.float() / 255, torch.Generator().manual_seed(0))
        m = create("sgd", net, ctx, lr=0.1)
        x = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
        y = torch.tensor([0, 1] * 4)
        m.begin_task(0, x, y)
        losses = [float(m.observe(ctx.augment(x, None), y, x)) for _ in range(2)]
        return losses, net.state_dict()

    eager, s_eager = one_step(False)
    compiled, s_compiled = one_step(True)
    assert compiled == pytest.approx(eager, rel=1e-4)
    assert s_eager.keys() == s_compiled.keys()  # checkpoints load either way


def test_compile_at_a_width_that_crashes_torch_is_refused_before_writing(workdir, prepared):
    from pbr.errors import UserError

    with pytest.raises(UserError, match="train.compile = true with model.width = 4 crashes"):
        _train(_cfg(prepared / "raw", train={"compile": True}))
    # CUDA graphs exist on a GPU only: a CPU run says so rather than compiling without them.
    with pytest.raises(UserError, match="train.compile = graphs needs a CUDA GPU .* this run trains on cpu"):
        _train(_cfg(prepared / "raw", train={"compile": "graphs", "device": "cpu"}))
    assert not (workdir / "artifacts").exists()


def test_per_task_epochs_train_each_task_its_own_number_of_epochs(workdir, prepared):
    cfg = _cfg(prepared / "raw", method={"name": "er", "reservoir": "first_epoch"}, train={"epochs": [1, 3, 2, 1, 2]})
    _train(cfg)
    done = [json.loads((workdir / f"artifacts/train/task_{k:02d}/accuracy.json").read_text()) for k in range(5)]
    assert [len(d["epochs"]) for d in done] == [1, 3, 2, 1, 2]
    run = json.loads((workdir / "artifacts/train/run.json").read_text())
    assert run["settings"]["epochs"] == [1, 3, 2, 1, 2] and run["settings"]["reservoir"] == "first_epoch"
    import platform  # and the versions it trained with, as the modules say theirs

    import numpy
    import pyarrow
    import torch

    v = run["versions"]
    assert (v["torch"].split("+")[0], v["numpy"], v["pyarrow"], v["python"]) \
        == (torch.__version__.split("+")[0], numpy.__version__, pyarrow.__version__, platform.python_version())
    # Offered once per task, ER's reservoir has seen exactly the stream, whatever the epochs.
    import torch

    state = torch.load(workdir / "artifacts/train/task_04/state.pt", weights_only=False)
    manifest = json.loads((workdir / "data/prepared/manifest.json").read_text())
    assert state["method"]["buffer"]["seen"] == sum(manifest["task_train_counts"])


def test_prepared_data_of_another_task_count_is_a_one_line_error(workdir, prepared):
    from pbr.errors import UserError

    with pytest.raises(UserError, match=r"data/prepared holds 5 tasks but data.n_tasks = 2; run dvc repro prepare"):
        _train(_cfg(prepared / "raw", data={"n_tasks": 2}))
    assert not (workdir / "artifacts/train").exists()  # nothing written


def test_a_saved_task_reloads_as_its_method_and_predicts_its_accuracy_row(workdir, prepared):
    """model.pt rebuilds the method (the score stage's way in): evaluating the reloaded method gives
    the row train recorded after that task."""
    import torch

    from pbr.data.shards import load_manifest
    from pbr.loop import evaluate
    from stages.pipeline import train

    summary, _ = _train(_cfg(prepared / "raw", method={"name": "pbr"}))
    manifest = load_manifest(workdir / "data/prepared")
    _, tests = train._load_tasks(manifest, torch.device("cpu"))
    for k in (1, 4):
        method, saved = trained.load_method(workdir / f"artifacts/train/task_{k:02d}/model.pt", manifest,
                                          torch.device("cpu"), torch.Generator().manual_seed(0))
        assert type(method).__name__ == "PBR" and saved["task"] == k
        c_row, t_row = evaluate(method, tests[: k + 1], k + 1, 256)
        unseen = [None] * (4 - k)
        assert c_row + unseen == summary["class_il"]["matrix"][k] and t_row + unseen == summary["task_il"]["matrix"][k]


def test_dvc_deps_of_train_are_what_the_resume_fingerprint_hashes(tmp_path):
    """One list (stages/runtime/paths.py TRAIN_CODE): an edit to the report or the metrics keeps a
    finished run; an edit to a method starts it over."""
    import yaml

    from stages.runtime import paths
    from stages.pipeline import train

    root = Path(__file__).resolve().parents[1]
    deps = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]["train"]["deps"]
    assert deps == ["data/prepared", *paths.TRAIN_CODE, *paths.CONFIG_CODE]
    score = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]["score"]["deps"]
    assert score == ["data/prepared", "artifacts/train", *paths.SCORE_CODE, *paths.CONFIG_CODE, "stages/runtime/plots.py"]
    for d in ("pbr", "stages"):
        shutil.copytree(root / d, tmp_path / d, ignore=shutil.ignore_patterns("__pycache__"))
    before = train.code_hash(tmp_path)
    assert before == train.code_hash(root)
    # The report, the metrics, the evaluation and the fidelity grid's readings (a row added to a sweep) are no training code.
    for f in ("stages/experiments/report.py", "pbr/metrics.py", "stages/pipeline/evaluate.py", "pbr/readings.py"):
        (tmp_path / f).write_text((tmp_path / f).read_text() + "\n# an edit\n")
    assert train.code_hash(tmp_path) == before
    scoring = train.code_hash(tmp_path, paths.SCORE_CODE)
    (tmp_path / "pbr/methods/er.py").write_text((tmp_path / "pbr/methods/er.py").read_text() + "\n# an edit\n")
    assert train.code_hash(tmp_path) != before
    # A scoring's parts are taken back only under its code, the network's included (it hashed two files).
    (tmp_path / "pbr/models/heads.py").write_text((tmp_path / "pbr/models/heads.py").read_text() + "\n# an edit\n")
    assert train.code_hash(tmp_path, paths.SCORE_CODE) != scoring


def test_every_library_module_training_loads_is_in_the_fingerprint_or_shapes_no_weights():
    """pbr/data/facts.py (the normalisation constants every input goes through) was left out: an
    edit to them kept the trained model. A module the train stage loads is hashed, or named here
    with why it cannot change the weights."""
    from stages.runtime import paths

    root = Path(__file__).resolve().parents[1]
    shapes_no_weights = {
        "pbr/__init__.py", "pbr/errors.py",  # the package; error messages
        # the raw archives to prepared shards: they reach training as data/prepared, hashed itself
        "pbr/data/__init__.py", "pbr/data/longtail.py", "pbr/data/sources.py",
    }
    r = subprocess.run([sys.executable, "-c", "import sys, stages.pipeline.train, stages.pipeline.trained\n"
                        "import pbr.loop, pbr.methods, pbr.data.shards, pbr.data.augment\n"
                        "print('\\n'.join(m.__file__ for n, m in sys.modules.items() if n.split('.')[0] == 'pbr'))"],
                       cwd=root, capture_output=True, text=True, check=True)
    loaded = {Path(f).resolve().relative_to(root).as_posix() for f in r.stdout.split()}
    hashed = {f for f in loaded if any(f == c or f.startswith(c + "/") for c in paths.TRAIN_CODE)}
    assert loaded - hashed - shapes_no_weights == set()
    score = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]["score"]["deps"]
    assert {"pbr/data/augment.py", "pbr/data/facts.py", "pbr/data/shards.py"} <= set(score)
    # The stages that draw PNGs depend on the module that draws them (the score stage's went stale).
    stages = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]
    for name in ("score", "evaluate"):
        assert "stages/runtime/plots.py" in stages[name]["deps"], name


def test_a_diverged_training_stops_with_one_line_and_keeps_nothing_half_written(workdir, prepared):
    from pbr.errors import UserError

    with pytest.raises(UserError, match=r"training diverged: the loss of task 1 epoch 1 is (nan|inf); lower train.lr"):
        _train(_cfg(prepared / "raw", method={"name": "sgd"}, train={"lr": 1e30}))
    assert not list((workdir / "artifacts/train").glob("task_*"))


def test_a_tasks_records_and_their_count_go_in_one_call(tmp_path):
    """The epochs' points, the task's accuracies and `pbr.train.logged_tasks` were three calls: a
    kill between the points and the count made the resumed try log the task again (each epoch
    twice in the run's charts). One call now, and nothing of it lost."""
    from mlflow import MlflowClient

    from stages.pipeline import train
    from stages.runtime import tracking

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.create_experiment("t")
    run_id = client.create_run(exp).info.run_id
    calls = []

    class Counting:
        def __getattr__(self, name):
            if name == "log_batch":
                calls.append(name)
            return getattr(client, name)

    tracker = tracking.StageRun(tracking._MlflowRecorder(Counting(), exp), run_id)
    rows = {"class_il": [[50.0, 0.0], [30.0, 70.0]], "task_il": [[90.0, 0.0], [80.0, 95.0]]}
    epochs_log = [[{"epoch": e, "loss": 1.0 / (e + 1), "accuracy": 0.5} for e in range(3)],
                  [{"epoch": e, "loss": 2.0 / (e + 1), "accuracy": 0.25} for e in range(2)]]
    train._track_task(tracker, 1, rows, epochs_log, [3, 2])
    assert calls == ["log_batch"]
    run = client.get_run(run_id)
    assert run.data.tags[train.LOGGED] == "2"
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "train.loss")] == [(3, 2.0), (4, 1.0)]
    assert run.data.metrics["class_il.seen_acc"] == 50.0 and run.data.metrics["class_il.task_acc_own"] == 70.0


# ----------------------------------------------------------------- the resume decision, on folders made by hand

def _task_files(out, k, buffer=True):
    task = out / f"task_{k:02d}"
    task.mkdir(parents=True, exist_ok=True)
    for name in ("state.pt", "model.pt", "accuracy.json") + (("buffer.parquet",) if buffer else ()):
        (task / name).write_text(f"task {k} {name}")


def _saved_run(out, n, fp, buffer=True):
    for k in range(n):
        _task_files(out, k, buffer)
    (out / "run.json").write_text(json.dumps({"fingerprint": fp}))


@pytest.mark.parametrize("lost", ["state.pt", "model.pt", "accuracy.json", "buffer.parquet"])
def test_a_task_missing_any_of_its_files_is_trained_again(tmp_path, lost):
    """Finished tasks are counted from the first up to one missing a file (state.pt is written last):
    task 1 without one of them leaves one finished task. A run without buffers keeps none and is
    not short of them."""
    from stages.pipeline import train

    for k in range(3):
        _task_files(tmp_path / "a", k)
    (tmp_path / "a" / "task_01" / lost).unlink()
    assert train._finished_tasks(tmp_path / "a", 5) == 1
    for k in range(3):
        _task_files(tmp_path / "b", k, buffer=False)
    assert train._finished_tasks(tmp_path / "b", 5) == 3


@pytest.fixture
def decide(tmp_path, monkeypatch):
    """_keep_or_start_over in a project of hand-made task folders: (log lines, tasks finished after)."""
    from stages.pipeline import train

    monkeypatch.chdir(tmp_path)  # the resume store lies under the project: .pbr/resume
    monkeypatch.setattr(train, "_what_changed", lambda saved, s, device: "settings changed")
    out = tmp_path / "artifacts/train"

    def run(fp):
        lines = []
        train._keep_or_start_over(out, fp, 5, lines.append, None, None)
        return lines, train._finished_tasks(out, 5)

    return out, run


def _store(out, tmp_path, n, fp):
    """What a killed run of `fp` kept in its resume store: its first n tasks and run.json."""
    from stages.runtime import resume

    made = tmp_path / "made"
    _saved_run(made, n, fp)
    for name in [f"task_{k:02d}" for k in range(n)] + ["run.json"]:
        resume.keep(made, name, fp)
    shutil.rmtree(made)


def test_the_same_run_keeps_its_tasks_and_another_starts_over(decide):
    out, run = decide
    _saved_run(out, 3, "a" * 64)
    assert run("a" * 64) == ([], 3)
    lines, finished = run("b" * 64)  # other settings, data or code: nothing of the old run is resumed
    assert finished == 0 and not out.exists() and lines == [f"{out}: settings changed since the saved tasks; starting over"]


def test_the_resume_store_gives_back_every_task_it_holds_beyond_the_outputs(decide, tmp_path):
    out, run = decide
    fp = "c" * 64
    _store(out, tmp_path, 4, fp)
    _saved_run(out, 2, fp)  # what `dvc exp run` checked out over the killed run's tasks
    lines, finished = run(fp)
    assert finished == 4 and lines == [f"{out}: took back the 4 finished task(s) of this run from .pbr/resume "
                                       "(dvc exp run checks out other outputs over them)"]
    assert (out / "task_03" / "model.pt").read_text() == "task 3 model.pt"


def test_the_store_is_taken_back_over_another_runs_outputs(decide, tmp_path):
    """The baseline's outputs (5 tasks of another run) checked out over the 3 a killed run of this
    one finished: none of the baseline's count, the 3 come back."""
    out, run = decide
    fp = "d" * 64
    _store(out, tmp_path, 3, fp)
    _saved_run(out, 5, "e" * 64)
    lines, finished = run(fp)
    assert finished == 3 and json.loads((out / "run.json").read_text())["fingerprint"] == fp
    assert lines and "took back the 3 finished task(s)" in lines[0]


def test_a_store_holding_no_more_than_the_outputs_is_left_alone(decide, tmp_path):
    out, run = decide
    fp = "f" * 64
    _store(out, tmp_path, 3, fp)
    _saved_run(out, 3, fp)
    assert run(fp) == ([], 3)


def test_the_fingerprint_is_the_settings_data_and_device():
    """A run resumes only where all of them are the saved run's (the class order, the shards' bytes,
    the device kind: a run begun on a CPU is not finished on a GPU)."""
    import types

    import torch

    from stages.pipeline import train

    s = types.SimpleNamespace(values={"lr": 0.1, "seed": 0})
    manifest = {"shards": [{"sha256": "1"}, {"sha256": "2"}], "class_order": [0, 1, 2]}
    cpu = torch.device("cpu")
    base = train.fingerprint(s, manifest, cpu)
    assert base == train.fingerprint(types.SimpleNamespace(values={"seed": 0, "lr": 0.1}), dict(manifest), cpu)
    others = [train.fingerprint(types.SimpleNamespace(values={"lr": 0.05, "seed": 0}), manifest, cpu),
              train.fingerprint(s, {**manifest, "shards": [{"sha256": "1"}, {"sha256": "3"}]}, cpu),
              train.fingerprint(s, {**manifest, "class_order": [2, 1, 0]}, cpu),
              train.fingerprint(s, manifest, torch.device("cuda"))]
    assert len({base, *others}) == 5


def test_an_auto_thread_run_resumes_on_its_last_finished_tasks_count(tmp_path, monkeypatch):
    """Its tasks trained on 2, 2 then 1 thread(s): after task 3 it goes on at 1, the count the
    uninterrupted run would have had by then."""
    import torch

    from stages.pipeline import train
    from stages.runtime import threads

    set_to = []
    monkeypatch.setattr(torch, "set_num_threads", set_to.append)
    monkeypatch.setattr(threads, "given_by_environment", lambda: False)
    (tmp_path / "run.json").write_text(json.dumps({"threads": "2,2,1,1,1", "threads_by_task": [2, 2, 1, 1, 1]}))
    assert train._threads_of_the_run(tmp_path, 3, "auto", 4, lambda *_: None) == 1 and set_to == [1]
    assert train._threads_of_the_run(tmp_path, 2, "auto", 2, lambda *_: None) == 2 and set_to == [1]
    assert train._threads_of_the_run(tmp_path, 3, 3, 3, lambda *_: None) == 3  # a count given is kept


class _Tracker:
    def __init__(self, joined):
        self.joined, self.series, self.restarted = joined, [], 0

    def start_over(self):
        self.restarted += 1
        self.joined = {}

    def log_series(self, points, tags):
        self.series.append(tags)

    def set_tags(self, *a):
        pass

    def log_new_params(self, *a):
        pass

    def log_artifact(self, *a):
        pass


def test_a_joined_run_that_logged_tasks_now_trained_again_is_left_as_it_was(workdir, prepared):
    """A killed try logged 5 tasks; tasks 4 and 5 were deleted since and train again: their records
    would be each task's twice in one run. The try's run is left as it was, and the new one gets
    every task's once."""
    from stages.pipeline import train

    cfg = _cfg(prepared / "raw", method={"name": "sgd"})
    _train(cfg)
    out = workdir / "artifacts/train"
    fp = json.loads((out / "run.json").read_text())["fingerprint"]
    for k in (3, 4):
        shutil.rmtree(out / f"task_{k:02d}")
    from stages.runtime import resume

    resume.forget(fp)
    tracker = _Tracker({train.LOGGED: "5", "pbr.fingerprint": fp})
    train.run(cfg, log=lambda *_: None, tracker=tracker)
    assert tracker.restarted == 1 and [t[train.LOGGED] for t in tracker.series] == [1, 2, 3, 4, 5]
