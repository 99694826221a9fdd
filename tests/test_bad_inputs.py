"""Bad input of every kind: one clear line naming the parameter or file and the fix, exit 2, and no
half-written artifact."""

import shutil
import subprocess
import sys

import pytest

import fakedata
from conftest import ROOT
from project import BIN, env, tree_bytes
from stages.runtime.config import Config, ConfigError, from_dict

# Every parameter with the invalid values a user can write for it (the keys methods declare: below).
INVALID = {
    "seed": ["x", 1.5, -1, True],
    "data.dataset": ["mnist", 10],
    "data.root": ["", 5],
    "data.download": ["yes", 1],
    "data.setting": ["random", 1],
    "data.imbalance_ratio": [0, -0.1, 1.5, "0.01", True],
    "data.n_tasks": [0, 3, 2.5, "5"],
    "data.seed": [True, "a", -1],
    "data.subset": ["lt-cil", "random", 0],
    "data.shard_mb": [0, -1, "big", 1e305],  # 1e305: an OverflowError sizing the shards
    "method.name": ["nosuch", 1],
    "method.buffer_size": [-5, 2.5, "200"],
    "train.epochs": [0, 1.5, [], [5, 0, 5, 5, 5], [5, 5], "5"],
    "train.batch_size": [0, 1.0],
    "train.replay_batch_size": [0, -1],
    "train.eval_batch_size": [0, "x"],
    "train.lr": [0, -0.1, "fast"],
    "train.lr_milestones": [[0.9, 0.7], [0.7, 0.7], [0, 0.5], [0.5, 1.0], [35, 45], 0.7, "fast", [True]],
    "train.device": ["tpu", 0],
    "train.precision": ["fp16"],
    "train.channels_last": ["yes"],
    "train.threads": [0, -1, 1.5, "many", 1025, 100000],  # 100000 failed reading the data as if damaged
    "train.compile": ["yes", 1],
    "model.width": [0, -1, 8.5, 2**40],
    "model.head": ["mlp"],
    "model.scale": [0, -1],
    "model.dropout": [1.0, -0.1, "x"],
    "score.dropout": [1.0, -0.5, "x"],
    "score.temperature": [0, "x", 1e-300],  # 1e-300: logits / T overflow, the MI NaN
    "score.mc_samples": [1, 0, 2.5, "many"],
}


# What the error message promises (a Setting's `allowed` text) -> numbers that break the promise.
# Read off the words the user sees, not off the check under test: a check that lets 0 through
# while its message says "positive" fails here.
PROMISES = {"positive": [0, -1]}  # and any ">= N" or "> N", and intervals
UNREAD = []  # checked settings whose message states no range read here: list their values by hand


def _outside(allowed):
    """Numbers outside the range `allowed` states: a word of PROMISES, '>= N' or '> N', or an
    interval '[0, 1)'."""
    import re

    out = [v for words, values in PROMISES.items() if words in allowed for v in values]
    for op, n in re.findall(r"(>=|>) (-?[\d.]+)", allowed):
        n = int(n) if n.lstrip("-").isdigit() else float(n)  # an integer key's bounds as integers
        out += [n - 1] + ([n] if op == ">" else [])
    for lo_bracket, lo, hi, hi_bracket in re.findall(r"([\[(])(-?[\d.]+), (-?[\d.]+)([\])])", allowed):
        lo, hi = float(lo), float(hi)
        out += [lo - 1, hi + 1] + ([lo] if lo_bracket == "(" else []) + ([hi] if hi_bracket == ")" else [])
    return out


def _invalid_values(setting):
    """What a user can get wrong for a key a method declares: a word outside its choices, a wrong
    type, and a number outside the range its error message states (`allowed`)."""
    import typing

    union = typing.get_origin(setting.type) in (typing.Union, __import__("types").UnionType)
    arms = typing.get_args(setting.type) if union else (setting.type,)
    out = []
    for arm in arms:
        if typing.get_origin(arm) is typing.Literal and arm is not typing.Literal["auto"]:
            out.append("no-such-choice")
        elif arm is bool:
            out += ["yes", 1]
        elif arm in (int, float):
            out += ["x"] + ([1.5] if arm is int else [])
            outside = _outside(setting.allowed)
            if setting.check is not None and not outside:
                UNREAD.append(f"{setting.key} ({setting.allowed!r})")
            out += outside
    return out


def _declared():
    from pbr.methods import METHODS

    return {f"method.{s.key}" if s.shared else f"method.{cls.name}.{s.key}": s
            for cls in METHODS.values() for s in cls.settings}


INVALID.update({key: _invalid_values(s) for key, s in _declared().items()})


def test_every_parameter_has_invalid_values_listed():
    assert set(INVALID) == set(Config().flat(every_method=True))
    assert all(INVALID.values())
    assert not UNREAD, f"no invalid numbers read off the stated range of {UNREAD}: add a word to PROMISES"


def _nested(key, value):
    for part in reversed(key.split(".")):
        value = {part: value}
    return value


CASES = [(k, v) for k, vs in INVALID.items() for v in [*vs, [1, 2], {"a": 1}]]


@pytest.mark.parametrize("key,value", CASES, ids=[f"{k}={v!r}" for k, v in CASES])
def test_every_invalid_value_is_one_line_naming_the_key(key, value):
    with pytest.raises(ConfigError) as e:
        from_dict(_nested(key, value))
    msg = str(e.value)
    assert msg.startswith(f"params.yaml: {key} = ") and "\n" not in msg, msg


# ---------------------------------------------------------------- through the `pbr` command

SMALL = {"data": {"download": False, "imbalance_ratio": 0.1}, "model": {"width": 4},
         "train": {"epochs": 1, "device": "cpu"}}


def _project(path, raw_root, **sections):
    import yaml

    path.mkdir(parents=True, exist_ok=True)
    params = {k: dict(v) for k, v in SMALL.items()}
    params["data"]["root"] = str(raw_root)
    for section, values in sections.items():
        params.setdefault(section, {}).update(values)
    (path / "params.yaml").write_text(yaml.safe_dump(params))
    return path


def _pbr(repo, stage, **more_env):
    """The real `pbr STAGE` process (its imports, its stderr, its exit status)."""
    import os

    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{repo / 'mlflow.db'}", **more_env}
    return subprocess.run([sys.executable, "-m", "stages.cli", stage], cwd=repo, capture_output=True, text=True,
                          env=env, timeout=300)


@pytest.fixture
def pbr(pbr_main):
    """`pbr STAGE` in this process (conftest's pbr_main). Real processes: the corrupted shard below,
    test_config's CLI tests, the missing archive in test_prepare_dvc."""
    return lambda repo, stage: pbr_main(stage, cwd=repo, env={"MLFLOW_TRACKING_URI": f"sqlite:///{repo / 'mlflow.db'}"})


def _one_line_error(r, *needles):
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    lines = [x for x in r.stderr.splitlines() if x.strip() and " INFO " not in x]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr[-2000:]
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def _leftovers(repo):
    """Files a failed stage must not leave: partial outputs under temporary names."""
    return [p for p in repo.rglob("*") if ".tmp-" in p.name or ".old-" in p.name or ".download-" in p.name]


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    root = tmp_path_factory.mktemp("raw")
    fakedata.write_cifar(root, 10, 60, 6)
    return root


def _run_stage_in(repo, stage):
    """`stage.run` (a module of stages/pipeline) in `repo`, in this process, quietly."""
    import os

    from stages.runtime.config import load_config

    cwd = os.getcwd()
    os.chdir(repo)
    try:
        stage.run(load_config(repo / "params.yaml"), log=lambda *_: None)
    finally:
        os.chdir(cwd)
    return repo


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, raw):
    from stages.pipeline import prepare

    return _run_stage_in(_project(tmp_path_factory.mktemp("prepared"), raw), prepare)


@pytest.mark.parametrize("damage,needle", [
    ("truncate", "truncated or corrupt"),
    ("garbage", "truncated or corrupt"),
    ("missing", "no cifar10 data in"),
])
def test_bad_archive(tmp_path, damage, needle, pbr):
    raw = tmp_path / "raw"
    archive = fakedata.write_cifar(raw, 10, 20, 4)
    if damage == "truncate":
        archive.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    elif damage == "garbage":
        archive.write_bytes(b"not an archive at all" * 100)
    else:
        archive.unlink()
    repo = _project(tmp_path / "repo", raw)
    _one_line_error(pbr(repo, "prepare"), needle)
    assert not (repo / "data").exists() and not _leftovers(repo)
    if damage == "missing":  # refused before the stage's run began: no FAILED run, no store made for it
        assert not (repo / "mlflow.db").exists()


def test_a_class_left_with_no_sample(tmp_path, raw, pbr):
    repo = _project(tmp_path, raw, data={"imbalance_ratio": 0.001})
    _one_line_error(pbr(repo, "prepare"), "data.imbalance_ratio", "no training image", "ratio >=")
    assert not (repo / "data/prepared").exists() and not _leftovers(repo)


def test_output_folder_that_cannot_be_written(tmp_path, raw, pbr):
    repo = _project(tmp_path, raw)
    (repo / "data").write_text("a file where the output folder should go")
    _one_line_error(pbr(repo, "prepare"), "data")
    assert (repo / "data").read_text().startswith("a file") and not _leftovers(repo)


def _copy(prepared, dest, **sections):
    import shutil

    shutil.copytree(prepared / "data", dest / "data")
    return _project(dest, "unused", **sections)


def test_corrupted_shard_is_caught_before_training(tmp_path, prepared):
    repo = _copy(prepared, tmp_path)
    shard = sorted((repo / "data/prepared/task_02").glob("train-*.parquet"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    _one_line_error(_pbr(repo, "train"), "task_02/train-000.parquet does not match its hash", "dvc repro prepare")
    assert not list((repo / "artifacts/train").glob("task_*")) and not _leftovers(repo)


def test_buffer_larger_than_the_stream(tmp_path, prepared, pbr):
    repo = _copy(prepared, tmp_path, method={"name": "er", "buffer_size": 100000})
    _one_line_error(pbr(repo, "train"), "method.buffer_size = 100000 is larger than the whole training stream")
    assert not (repo / "artifacts").exists() and not _leftovers(repo)


def test_more_threads_than_cores_is_warned_of_before_the_run(tmp_path, prepared, pbr, monkeypatch):
    import torch

    from pbr.errors import UserError
    from stages.pipeline import train
    from stages.runtime import threads

    def stop(*a, **k):  # the warning is said before the run's settings: no training needed to see it
        raise UserError("stopped after the thread count")

    monkeypatch.setattr(threads, "available_cores", lambda: 1)
    monkeypatch.setattr(train, "settings", stop)
    repo = _copy(prepared, tmp_path, train={"threads": 2})
    was = torch.get_num_threads()
    try:
        r = pbr(repo, "train")
    finally:
        torch.set_num_threads(was)
    assert r.returncode == 2 and r.stderr.splitlines()[-1] == "error: stopped after the thread count", r.stderr
    assert ("warning: train.threads = 2 is more than the 1 core(s) this process may use: the threads take turns on "
            "them (slower); use at most 1, or auto") in r.stdout + r.stderr


def test_a_full_disk_names_the_folder_being_written(tmp_path, raw, prepared, pbr, monkeypatch):
    """A write's own OSError on a full disk names no file (Python's f.write, Arrow's writer, as on a
    2 MB tmpfs): the line said only "No space left on device", not which disk to free."""
    import errno

    import pyarrow.parquet as pq

    from pbr.data import shards

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")  # what Path.write_bytes raised there

    monkeypatch.setattr(shards, "_write_split", full)
    repo = _project(tmp_path / "p", raw)
    _one_line_error(pbr(repo, "prepare"), "error: data/prepared: No space left on device (or on the MLflow store's "
                    "disk, if that is another); check that the location is writable and has space")
    assert not _leftovers(repo)

    def arrow_full(*a, **k):  # pyarrow's own: errno 28, no filename
        raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on device")

    monkeypatch.setattr(pq, "write_table", arrow_full)
    repo = _copy(prepared, tmp_path / "t", method={"name": "er", "buffer_size": 20})
    r = pbr(repo, "train")  # after the first task's epoch line
    assert (r.returncode, r.stderr.splitlines()[-1]) == (2, "error: artifacts/train: No space left on device (or on "
                                                            "the MLflow store's disk, if that is another); check "
                                                            "that the location is writable and has space")
    assert not _leftovers(repo)


def test_training_output_that_cannot_be_written(tmp_path, prepared, pbr):
    repo = _copy(prepared, tmp_path)
    (repo / "artifacts").write_text("in the way")
    _one_line_error(pbr(repo, "train"), "artifacts")
    assert not _leftovers(repo)


def test_a_failed_torch_save_is_an_oserror_naming_the_file(tmp_path):
    """torch.save reports a failed write (a full disk, a quota) as a RuntimeError of its C++ writer, which
    the CLI would print as a traceback: the stages' saves make it the OSError, naming the file, that the
    CLI prints in one line. A file-size limit makes the write fail for real."""
    import resource
    import signal

    import torch

    from stages.runtime import artifacts

    ignored = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write then fails instead of the process
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (10_000, hard))
    try:
        with pytest.raises(OSError) as e:
            artifacts.save_torch({"w": torch.zeros(100_000)}, tmp_path / "model.pt")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, ignored)
    assert e.value.filename == str(tmp_path / "model.pt") and e.value.strerror.startswith("writing it failed (")


def test_ui_without_a_store_its_experiment_or_its_port(tmp_path, pbr_main):
    """`pbr ui` before any stage ran, or on a port in use: one line, and no empty store created on the way."""
    run = lambda **e: pbr_main("ui", cwd=tmp_path, env=e)  # noqa: E731
    _one_line_error(run(MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}"), "no MLflow store at", "dvc repro")
    assert not (tmp_path / "mlflow.db").exists()
    from mlflow import MlflowClient

    MlflowClient(f"sqlite:///{tmp_path / 'other.db'}").create_experiment("someone-else")
    _one_line_error(run(MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'other.db'}", MLFLOW_EXPERIMENT_NAME="pbr"),
                    "has no experiment 'pbr'", "MLFLOW_EXPERIMENT_NAME")
    import socket

    MlflowClient(f"sqlite:///{tmp_path / 'runs.db'}").create_experiment("pbr")
    with socket.socket() as taken:  # MLflow's own server would start, then exit 0 on a port in use
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        _one_line_error(pbr_main("ui", "--port", str(port), cwd=tmp_path,
                                 env={"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'runs.db'}"}),
                        f"pbr ui --port {port}: the port is in use", "--port")


def test_a_store_named_by_tracking_uri_is_said_to_be_the_flags(tmp_path, pbr_main, monkeypatch):
    """The errors about a store --tracking-uri named said "pass --tracking-uri" (it was passed) or
    "check MLFLOW_TRACKING_URI" (not set)."""
    from mlflow import MlflowClient

    from project import free_port

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("PBR_OFFLINE", raising=False)
    MlflowClient(f"sqlite:///{tmp_path / 'src.db'}").create_experiment("pbr")
    (tmp_path / "bad.db").write_text("not a database")
    pbr = lambda *args: pbr_main(*args, cwd=tmp_path)  # noqa: E731
    line = _one_line_error(pbr("import", "src.db", "--tracking-uri", f"sqlite:///{tmp_path / 'src.db'}"))
    assert line.endswith(f"is the store it would import into (sqlite:///{tmp_path / 'src.db'}): give --tracking-uri "
                         "another store"), line
    line = _one_line_error(pbr("import", "src.db", "--tracking-uri", f"journal:{tmp_path / 'j'}"))
    assert line.startswith(f"error: --tracking-uri journal:{tmp_path / 'j'} holds runs recorded to plain files"), line
    line = _one_line_error(pbr("import", "src.db", "--tracking-uri", f"sqlite:///{tmp_path / 'bad.db'}"))
    assert line.endswith("; check --tracking-uri or remove a corrupt mlflow.db"), line
    line = _one_line_error(pbr("report", "--tracking-uri", f"http://127.0.0.1:{free_port()}"))
    assert line.endswith("is unreachable (connection refused): start it, or check --tracking-uri"), line
    line = _one_line_error(pbr("report", "--tracking-uri", f"sqlite:///{tmp_path / 'bad.db'}"))
    assert line.endswith("; check --tracking-uri"), line
    line = _one_line_error(pbr("ui", "--tracking-uri", f"sqlite:///{tmp_path / 'none.db'}"))
    assert line.endswith("run a stage first (dvc repro), or check --tracking-uri"), line
    # Named by the environment, the errors say so, as before.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'bad.db'}")
    assert _one_line_error(pbr("report")).endswith("; check --tracking-uri / MLFLOW_TRACKING_URI")
    assert _one_line_error(pbr("import", "src.db")).endswith("; check MLFLOW_TRACKING_URI or remove a corrupt mlflow.db")


def test_an_mlflow_that_cannot_import_is_said_to_be_the_install_not_the_store(tmp_path, raw, pbr, pbr_main,
                                                                             monkeypatch):
    """MLflow before 3.9 under SQLAlchemy 2.1 (an install without constraints.txt) fails importing its
    sqlite store inside MlflowClient: that was said as "remove a corrupt mlflow.db", whose removal
    loses every run and mends nothing."""
    import mlflow

    def broken(*args, **kwargs):
        raise ImportError("cannot import name 'FallbackAsyncAdaptedQueuePool' from 'sqlalchemy.pool'")

    said = ("error: the MLflow installation is inconsistent (ImportError: cannot import name "
            "'FallbackAsyncAdaptedQueuePool' from 'sqlalchemy.pool'): run `pip check`, then reinstall the tested "
            "versions: `pip install -c constraints.txt -e .` in the checkout")
    repo = _project(tmp_path / "repo", raw)
    mlflow.MlflowClient(f"sqlite:///{repo / 'src.db'}").create_experiment("pbr")  # runs copied from elsewhere
    monkeypatch.setattr(mlflow, "MlflowClient", broken)
    assert _one_line_error(pbr(repo, "prepare")) == said  # a stage, before it writes anything
    assert not (repo / "data").exists()
    assert _one_line_error(pbr_main("import", "src.db", cwd=repo)) == said  # not "SOURCE: ...", not src.db's fault


@pytest.fixture(scope="module")
def trained(tmp_path_factory, prepared):
    """ER (it keeps a buffer) trained on the small prepared set: the files a damaged run is made of."""
    from stages.pipeline import train

    return _run_stage_in(_copy(prepared, tmp_path_factory.mktemp("trained"), method={"name": "er", "buffer_size": 20}),
                         train)


def _copy_trained(trained, dest):
    """The trained project as after its scoring began: no resume store (stages/runtime/resume.py)."""
    shutil.copytree(trained, dest, ignore=shutil.ignore_patterns(".pbr"))
    return dest


@pytest.mark.parametrize("stage,damage,needle", [
    ("evaluate", "task_01/model.pt", "task_01/model.pt cannot be read (UnpicklingError): it is damaged"),
    ("score", "task_04/model.pt", "task_04/model.pt cannot be read (UnpicklingError): it is damaged"),
    ("train", "task_02/state.pt", "task_02/state.pt cannot be read (UnpicklingError): it is damaged"),
    ("train", "run.json", "run.json cannot be read (JSONDecodeError): it is damaged; delete artifacts/train to train again"),
    ("evaluate", "accuracy.json", "accuracy.json cannot be read (JSONDecodeError)"),
    ("evaluate", "task_03/buffer.parquet", "task_03/buffer.parquet cannot be read (ArrowInvalid)"),
])
def test_a_damaged_saved_file_is_one_line_naming_it(tmp_path, trained, pbr, stage, damage, needle):
    repo = _copy_trained(trained, tmp_path / "repo")
    path = repo / "artifacts/train" / damage
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 3] if path.suffix == ".json" else b"\xdd" * 64)
    if stage == "train":  # the damaged task is the one training resumes from
        for k in (3, 4):
            shutil.rmtree(repo / f"artifacts/train/task_{k:02d}")
        (repo / "artifacts/train/accuracy.json").unlink()
    _one_line_error(pbr(repo, stage), needle, "dvc")
    assert not _leftovers(repo)


def test_a_damaged_model_leaves_the_last_evaluation_whole(tmp_path, trained):
    """evaluate wrote the matrices and the accuracy curve, then read the models: a damaged one left
    reports/eval half new, half the last run's."""
    from pbr.errors import UserError
    from stages.pipeline import evaluate

    repo = _run_stage_in(_copy_trained(trained, tmp_path / "repo"), evaluate)
    before = {p: p.read_bytes() for p in (repo / "reports").rglob("*") if p.is_file()}
    for p in before:
        p.write_bytes(b"the last evaluation's " + p.name.encode())  # whatever is rewritten shows
    path = repo / "artifacts/train/task_03/model.pt"
    path.write_bytes(b"\xdd" * 64)
    with pytest.raises(UserError, match="task_03/model.pt cannot be read"):
        _run_stage_in(repo, evaluate)
    assert all(p.read_bytes() == b"the last evaluation's " + p.name.encode() for p in before)


@pytest.mark.parametrize("stage", ["score", "evaluate"])
def test_a_run_trained_on_other_prepared_data_is_refused(tmp_path, raw, trained, stage):
    """params.yaml edited and data/prepared rebuilt (`pbr prepare`, `dvc repro -s prepare`), then
    score or evaluate alone: the models trained on the old stream were scored on the new one and
    recorded as a complete run of the new settings (both data checks passed: params match the new
    data, and run.json keeps no data key)."""
    import importlib
    import json

    import yaml

    from pbr.errors import UserError
    from stages.pipeline import prepare

    module = importlib.import_module(f"stages.pipeline.{stage}")
    repo = _copy_trained(trained, tmp_path / "repo")
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["data"].update(imbalance_ratio=0.5, root=str(raw))
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    _run_stage_in(repo, prepare)
    with pytest.raises(UserError, match=r"^artifacts/train was trained on other prepared data than data/prepared "
                                        r"holds now; run `dvc repro`"):
        _run_stage_in(repo, module)
    assert not (repo / "reports/metrics.json").exists() and not (repo / "artifacts/score").exists()
    # A run.json from before it kept the manifest's hash: checked on the number of tasks.
    run = repo / "artifacts/train/run.json"
    record = json.loads(run.read_text())
    del record["data_manifest"]
    run.write_text(json.dumps(record))
    params["data"]["n_tasks"] = 2
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    _run_stage_in(repo, prepare)
    with pytest.raises(UserError, match="trained on other prepared data"):
        _run_stage_in(repo, module)
    # ... and on its first task's classes: the shuffled stream's task 0 is not the ordered one's [0, 1].
    params["data"].update(n_tasks=5, setting="shuffled")
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    _run_stage_in(repo, prepare)
    assert json.loads((repo / "data/prepared/manifest.json").read_text())["task_classes"][0] != [0, 1]
    with pytest.raises(UserError, match="trained on other prepared data"):
        _run_stage_in(repo, module)
    # No run.json at all: nothing says what the run was; not read blind.
    run.unlink()
    with pytest.raises(UserError, match=r"^artifacts/train/run.json is missing; restore it with `dvc checkout --force"):
        _run_stage_in(repo, module)


def test_the_fix_for_a_damaged_task_works_while_a_resume_store_holds_it(tmp_path, trained, pbr, monkeypatch):
    """After a killed run the resume store links its finished tasks (stages/runtime/resume.py): a file
    damaged in place is damaged there too, and deleting the task folder, as the error says, must not
    take it back from the store (it did, and the same error came again, however often)."""
    import json

    from stages.runtime import resume

    repo = _copy_trained(trained, tmp_path / "repo")
    out = repo / "artifacts/train"
    for k in (3, 4):
        shutil.rmtree(out / f"task_{k:02d}")
    (out / "accuracy.json").unlink()
    monkeypatch.chdir(repo)
    fp = json.loads((out / "run.json").read_text())["fingerprint"]
    for name in ("task_00", "task_01", "task_02", "run.json"):  # what the killed run kept
        resume.keep(out, name, fp)
    (out / "task_02/state.pt").write_bytes(b"\xdd" * 64)  # in place: the store's link reads the same bytes
    _one_line_error(pbr(repo, "train"), "task_02/state.pt cannot be read", "delete its task folder")
    shutil.rmtree(out / "task_02")
    r = pbr(repo, "train")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "resuming after task 2 of 5" in r.stdout + r.stderr and "took back" not in r.stdout + r.stderr


def test_a_deleted_buffer_is_missing_for_evaluate_and_trained_again_by_train(tmp_path, trained, pbr):
    repo = _copy_trained(trained, tmp_path / "repo")
    (repo / "artifacts/train/task_01/buffer.parquet").unlink()
    # evaluate said nothing and drew an empty buffer for task 1
    _one_line_error(pbr(repo, "evaluate"), "task_01/buffer.parquet is missing", "dvc checkout --force artifacts/train")
    r = pbr(repo, "train")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "resuming after task 1 of 5" in r.stdout + r.stderr
    assert (repo / "artifacts/train/task_01/buffer.parquet").is_file()


def test_a_network_too_big_for_memory_leaves_the_saved_run_alone(tmp_path, trained, pbr, monkeypatch):
    """Other settings start a run over, which deletes the saved tasks: only once the network is built
    (it deleted them first, then died allocating a network of width 2**40)."""
    import yaml

    from stages.pipeline import train

    repo = _copy_trained(trained, tmp_path / "repo")
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["model"]["width"] = 1024
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    before = sorted(p.name for p in (repo / "artifacts/train").iterdir())

    def allocate(*_, **__):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:119] DefaultCPUAllocator: can't allocate memory")

    monkeypatch.setattr(train, "build_method", allocate)
    _one_line_error(pbr(repo, "train"), "model.width = 1024: the network does not fit in cpu's memory")
    assert sorted(p.name for p in (repo / "artifacts/train").iterdir()) == before


def test_a_run_killed_while_scoring_keeps_its_training_to_take_back(tmp_path, trained, pbr):
    """A queued run killed while scoring (a SLURM time limit) is queued again from the baseline's
    outputs: the store of its training went when scoring started, so it trained again from the first
    task. It goes when the evaluation ends."""
    repo = tmp_path / "repo"
    shutil.copytree(trained, repo)
    e = {**env(), "MLFLOW_TRACKING_URI": f"sqlite:///{repo / 'mlflow.db'}"}
    r = subprocess.run([str(BIN / "pbr"), "score"], cwd=repo, env={**e, "PBR_KILL_AT": "score:after_task1"},
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == -9, r.stderr[-2000:]
    assert any((repo / ".pbr/resume").glob("*/task_00"))
    for stage in ("score", "evaluate"):  # in this process: the kill above is the one that needs its own
        r = pbr(repo, stage)
        assert r.returncode == 0, r.stderr[-2000:]
        assert any((repo / ".pbr/resume").glob("*/task_00")) == (stage == "score"), stage


def test_evaluate_lets_the_trained_runs_resume_store_go_and_tasks_without_run_json_start_over(tmp_path, trained, pbr):
    """An offline sweep runs train then evaluate, no scoring: the store went nowhere before. And task
    folders that no run.json vouches for are not adopted by the next run."""
    repo = tmp_path / "repo"
    shutil.copytree(trained, repo)
    assert any((repo / ".pbr/resume").iterdir())
    assert pbr(repo, "evaluate").returncode == 0
    assert not any((repo / ".pbr/resume").iterdir())
    (repo / "artifacts/train/run.json").unlink()
    # and what a killed prepare left beside its output (DVC restored that stage from its cache)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    shutil.copytree(repo / "data/prepared", repo / f"data/.prepared.tmp-{dead.pid}")
    r = pbr(repo, "train")
    assert r.returncode == 0 and "no run.json says which run its files belong to; starting over" in r.stdout
    assert "trained 5 task(s)" in r.stdout
    assert sorted(p.name for p in (repo / "data").iterdir()) == ["prepared"]


_STALE = [("data.imbalance_ratio", 0.5, "data/prepared was built with data.imbalance_ratio = 0.1 but the params file says 0.5"),
          ("data.dataset", "cifar100", "data/prepared was built with data.dataset = 'cifar10' but the params file says "
                                       "'cifar100'"),
          ("model.width", 8, "artifacts/train was trained with model.width = 4 but the params file says 8"),
          # auto in the run, a value today that auto did not resolve to: the run's tags said resolved.lr, its
          # param the new value, and the report read the param.
          ("train.lr", 0.0123, "artifacts/train was trained with train.lr = auto, which it resolved to 0.1, but the "
                               "params file says 0.0123")]


# Train trains again with other training params: only a data key reaches it.
@pytest.mark.parametrize("stage,key,value,needle", [(stage, *case) for stage in ("train", "score", "evaluate")
                                                    for case in _STALE if stage != "train" or case[0].startswith("data.")])
def test_params_that_did_not_build_the_data_or_train_the_run_are_refused(tmp_path, trained, pbr, stage, key, value,
                                                                          needle):
    """`pbr train`, `score` or `evaluate` after params.yaml changed without the stages before it: the run
    was recorded complete under settings it never had (another dataset or imbalance ratio: the wrong
    row of the report); train took TinyImageNet's settings for CIFAR-10's shards."""
    import yaml

    repo = _copy_trained(trained, tmp_path / "repo")
    params = yaml.safe_load((repo / "params.yaml").read_text())
    section, name = key.split(".")
    params[section][name] = value
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    before = {p: p.stat().st_mtime_ns for p in (repo / "artifacts").rglob("*")}
    _one_line_error(pbr(repo, stage), needle, "dvc repro")
    assert {p: p.stat().st_mtime_ns for p in (repo / "artifacts").rglob("*")} == before
    assert not (repo / "reports/metrics.json").exists()
    assert not (repo / "mlflow.db").exists()  # refused before the stage's MLflow run began: no FAILED run


def test_one_archive_prepares_the_same_bytes_wherever_and_however_it_lies(tmp_path, raw, prepared):
    """The manifest held data.root, data.download and the archive's absolute path: the same archive
    at another path, or extracted, gave another data/prepared (DVC hash, `pbr.data_manifest`) with
    the same shards."""
    import tarfile

    from stages.pipeline import prepare

    elsewhere = tmp_path / "another" / "place"
    shutil.copytree(raw, elsewhere)
    again = _run_stage_in(_project(tmp_path / "p", elsewhere, data={"download": True}), prepare)
    assert tree_bytes(again / "data/prepared") == tree_bytes(prepared / "data/prepared")
    extracted = tmp_path / "extracted"
    with tarfile.open(raw / "cifar-10-python.tar.gz") as tar:
        tar.extractall(extracted, filter="data")
    assert (extracted / "cifar-10-batches-py").is_dir()
    third = _run_stage_in(_project(tmp_path / "q", extracted), prepare)
    assert tree_bytes(third / "data/prepared") == tree_bytes(prepared / "data/prepared")


def test_a_manifest_from_before_a_data_key_reads_as_its_old_default():
    """data.subset came later: data prepared before it was the seeded subset, and a run asking for
    another subset on it was let through."""
    from stages.runtime.config import refuse_stale
    from pbr.errors import UserError

    cfg = from_dict({"data": {"subset": "ldam", "imbalance_ratio": 0.1}})
    old = {"params": {k: v for k, v in cfg.to_dict()["data"].items() if k != "subset"}}
    with pytest.raises(UserError, match="data.subset = 'seeded' but the params file says 'ldam'"):
        refuse_stale(cfg, old)
    refuse_stale(from_dict({"data": {"imbalance_ratio": 0.1}}), old)


def test_ctrl_c_says_what_is_kept_and_how_to_resume(tmp_path, trained, pbr, monkeypatch):
    """Ctrl-C printed "interrupted" and no more (under DVC, only DVC's own error line)."""
    from stages.pipeline import train

    def interrupted(*_, **__):
        raise KeyboardInterrupt

    monkeypatch.setattr(train, "run", interrupted)
    r = pbr(_copy_trained(trained, tmp_path / "repo"), "train")
    assert r.returncode == 130, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.splitlines()[-1] == (
        "interrupted: what finished is kept (a stage's finished tasks too); the same command, `dvc repro` or "
        "`dvc exp run` resumes")


def test_sigterm_stops_a_stage_as_ctrl_c_does_and_its_run_says_killed(tmp_path, trained, records_to_files):
    """A SLURM time limit, `kill` or `timeout` sends SIGTERM: the stage died at once, silently, and its
    run stayed RUNNING until a later stage on the same host marked it (on a team server, from another
    node, never)."""
    import time

    from project import BIN, env

    repo = _copy_trained(trained, tmp_path / "repo")
    shutil.rmtree(repo / "artifacts/train")
    import yaml

    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["train"]["epochs"] = 40  # still training when the signal comes
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    import signal

    # As `nohup` starts it: SIGHUP ignored, which it must stay.
    proc = subprocess.Popen([str(BIN / "pbr"), "train"], cwd=repo, env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    try:
        deadline = time.time() + 120
        while not (repo / "artifacts/train/run.json").is_file():  # the run is recorded, training begins
            assert proc.poll() is None and time.time() < deadline, proc.communicate()
            time.sleep(0.2)
        proc.send_signal(signal.SIGHUP)
        time.sleep(1)
        assert proc.poll() is None, proc.communicate()
        proc.terminate()
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, (proc.returncode, err[-2000:])
    assert err.splitlines()[-1].startswith("interrupted: what finished is kept")
    [run] = records_to_files.search_runs(["pbr"])
    assert run.info.status == "KILLED"


def _train_killed_at(tmp_path, trained, monkeypatch, stop):
    """The train stage of an untrained copy in-process under its MLflow run, interrupted where
    `stop(point)`, then ready to run again (the returned call, faults off)."""
    from stages.pipeline import train
    from stages.runtime import faults, tracking
    from stages.runtime.config import load_config

    repo = _copy_trained(trained, tmp_path / "repo")
    shutil.rmtree(repo / "artifacts/train")
    monkeypatch.chdir(repo)
    monkeypatch.setenv("PBR_GIT_COMMIT", "c" * 40)
    cfg = load_config(repo / "params.yaml")

    def train_once():
        with tracking.stage_run("train", cfg.flat(), repo / "params.yaml") as run:
            train.run(cfg, log=lambda *_: None, tracker=run)

    def point(name):
        if stop(name):
            raise KeyboardInterrupt

    monkeypatch.setattr(faults, "point", point)
    with pytest.raises(KeyboardInterrupt):
        train_once()
    monkeypatch.setattr(faults, "point", lambda name: None)
    return train_once


@pytest.mark.parametrize("same_code", [True, False])
def test_a_killed_trainings_run_is_joined_only_by_the_same_training(tmp_path, trained, records_to_files, monkeypatch,
                                                                      same_code):
    """Interrupted after two tasks, then run again: with the same code the next try resumes in the
    same run and logs the other three tasks once; after an uncommitted edit of the training code
    (same commit, same params: the same execution's key) training starts over, and its records go
    to a run of their own, the interrupted one left as it was (they were mixed in one run)."""
    from stages.pipeline import train

    train_once = _train_killed_at(tmp_path, trained, monkeypatch, lambda point: point == "train:after_task1")
    if not same_code:
        monkeypatch.setattr(train, "code_hash", lambda: "edited since")
    train_once()

    def steps(run):
        return sorted(m.step for m in records_to_files.get_metric_history(run.info.run_id, "class_il.seen_acc"))

    runs = sorted(records_to_files.search_runs(["pbr"]), key=lambda r: r.info.status)
    if same_code:
        assert [(r.info.status, steps(r)) for r in runs] == [("FINISHED", [0, 1, 2, 3, 4])]
    else:
        assert [(r.info.status, steps(r)) for r in runs] == [("FINISHED", [0, 1, 2, 3, 4]), ("KILLED", [0, 1])]


def test_a_try_killed_before_its_first_task_and_resolved_otherwise_is_not_joined(tmp_path, trained, records_to_files,
                                                                                monkeypatch):
    """Killed in its first task (no task logged, its resolved settings logged as params), then run
    again resolving another lr (an uncommitted edit of a method's best): the new try went on in
    that run, and MLflow keeps a param's first value, so the run held one try's resolved.lr param
    and the other's tag. It goes on in a run of its own; the killed one stays as it was."""
    from stages.runtime.run_settings import RunSettings

    train_once = _train_killed_at(tmp_path, trained, monkeypatch, lambda point: point.startswith("train:task0:"))
    first = RunSettings.resolve.__func__
    monkeypatch.setattr(RunSettings, "resolve", classmethod(
        lambda cls, c, d: (lambda s: cls({**s.values, "lr": s.values["lr"] * 2}, s.sources))(first(cls, c, d))))
    train_once()
    runs = {r.info.status: r for r in records_to_files.search_runs(["pbr"])}
    assert sorted(runs) == ["FINISHED", "KILLED"]
    for r in runs.values():
        assert r.data.params["resolved.lr"] == r.data.tags["resolved.lr"]
    assert float(runs["FINISHED"].data.params["resolved.lr"]) == 2 * float(runs["KILLED"].data.params["resolved.lr"])


@pytest.mark.parametrize("stage", ["score", "evaluate"])
def test_score_or_evaluate_before_training_is_refused_before_its_mlflow_run(tmp_path, prepared, pbr, stage):
    """Prepared data and no training: one line, and no FAILED run in the store (the missing model was
    found inside the stage's run, which then recorded a failure and made a store for it)."""
    repo = _copy(prepared, tmp_path / "repo")
    _one_line_error(pbr(repo, stage), "artifacts/train/accuracy.json is missing: training has not finished",
                    "dvc repro train")
    assert not (repo / "mlflow.db").exists()


def test_score_names_a_missing_model_before_it_scores_a_task(tmp_path, trained, pbr):
    """A task folder gone from a trained run: the scoring said so only on reaching that task, the
    tasks before it scored for nothing (minutes of MC dropout on real data)."""
    repo = _copy_trained(trained, tmp_path / "repo")
    shutil.rmtree(repo / "artifacts/train/task_03")
    _one_line_error(pbr(repo, "score"), "artifacts/train/task_03/model.pt is missing", "dvc checkout --force")
    assert not (repo / "mlflow.db").exists()  # refused before the stage's run began: nothing scored


def test_an_accuracy_record_without_its_parts_is_one_line(tmp_path, trained, pbr):
    """Valid JSON that is no finished run's record (an older run's file, a hand edit): a KeyError
    traceback from deep in evaluate."""
    repo = _copy_trained(trained, tmp_path / "repo")
    (repo / "artifacts/train/accuracy.json").write_text("{}")
    _one_line_error(pbr(repo, "evaluate"), "accuracy.json is not a finished run's record (it lacks settings, "
                                           "class_il, task_il)", "dvc checkout --force artifacts/train")


def test_an_empty_experiment_name_is_the_default_one(tmp_path, prepared, pbr_main):
    """MLFLOW_EXPERIMENT_NAME set but empty (`export MLFLOW_EXPERIMENT_NAME=` in a script): every
    stage failed with an AttributeError traceback from MLflow."""
    repo = _copy_trained(prepared, tmp_path / "repo")
    db = repo / "mlflow.db"
    r = pbr_main("prepare", cwd=repo, env={"MLFLOW_TRACKING_URI": f"sqlite:///{db}", "MLFLOW_EXPERIMENT_NAME": ""})
    assert r.returncode == 0, r.stderr[-2000:]
    import sqlite3

    with sqlite3.connect(db) as c:
        assert c.execute("SELECT e.name FROM runs r JOIN experiments e ON r.experiment_id = e.experiment_id").fetchall() == [("pbr",)]


@pytest.mark.parametrize("error", [
    "torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79 GiB')",
    # What a CPU run raised under a memory limit (width 256, batch 512, ulimit -v 6 GB), checked by hand.
    "RuntimeError('[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can\\'t allocate memory: "
    "you tried to allocate 55574528 bytes')",
])
def test_running_out_of_memory_mid_run_is_one_line(tmp_path, prepared, pbr, monkeypatch, error):
    """Only building the network was guarded: memory running out in training or scoring (a larger
    batch, a GPU others fill) printed torch's traceback."""
    import torch

    from stages.pipeline import train

    def out_of_memory(*a, **k):
        raise eval(error, {"torch": torch})

    monkeypatch.setattr(train, "run", out_of_memory)
    repo = _copy(prepared, tmp_path / "repo")
    _one_line_error(pbr(repo, "train"), "error: out of memory while it ran (", "lower train.batch_size",
                    "the same command resumes")
    # Any other RuntimeError is the bug it is: a traceback, not a tidy line that hides it.
    monkeypatch.setattr(train, "run", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("shape mismatch")))
    with pytest.raises(RuntimeError, match="shape mismatch"):
        pbr(repo, "train")


def test_compile_on_a_cpu_without_a_cxx_compiler_is_refused_before_the_saved_run_is_touched(tmp_path, trained):
    """Inductor needs a C++ compiler for its CPU kernels: without one the run said "starting over",
    deleted the finished tasks, and failed at the first step 40 s later in a 396-line traceback."""
    import yaml

    from project import tree_bytes

    repo = _copy_trained(trained, tmp_path / "repo")
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["train"]["compile"], params["model"]["width"] = True, 8
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    before = tree_bytes(repo / "artifacts")
    _one_line_error(_pbr(repo, "train", CXX="/nonexistent/g++"),
                    "error: train.compile needs a C++ compiler on a CPU (none found: /nonexistent/g++ does not run; "
                    "set CXX to one) or set train.compile: false")
    assert tree_bytes(repo / "artifacts") == before and not (repo / "mlflow.db").exists()
    # CXX naming a folder: inductor's search raised PermissionError, read as an unwritable location
    _one_line_error(_pbr(repo, "train", CXX=str(tmp_path)),
                    f"error: train.compile needs a C++ compiler on a CPU (none found: {tmp_path} does not run; "
                    "set CXX to one) or set train.compile: false")
    assert tree_bytes(repo / "artifacts") == before


def test_a_failed_compile_is_one_line(tmp_path, prepared, pbr, monkeypatch):
    """The backstop for whatever else stops inductor building the kernels mid-run."""
    from torch._inductor.exc import InductorError, InvalidCxxCompiler

    from stages.pipeline import train

    def fails(*a, **k):
        raise InductorError(InvalidCxxCompiler("/usr/bin/g++"), None)

    monkeypatch.setattr(train, "run", fails)
    _one_line_error(pbr(_copy(prepared, tmp_path / "repo"), "train"),
                    "error: train.compile: torch.compile could not build the model (InvalidCxxCompiler: ",
                    "set train.compile: false")


def test_a_path_outside_the_pipeline_that_cannot_be_made_is_no_pipeline_file(tmp_path, pbr_main):
    """A missing path of the user's (an --offline folder, a store's folder) was said to be a pipeline
    file for `dvc checkout` to restore."""
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    line = _one_line_error(pbr_main("sweep", "table1", "--seeds", "1", "--offline", "/proc/pbr-nowhere", cwd=tmp_path),
                           "/proc/pbr-nowhere: no such file or folder; check the path")
    assert "dvc" not in line


def test_an_explicit_value_that_auto_resolved_to_is_the_same_run(tmp_path, trained):
    """Writing out what the run's auto resolved to (lr 0.1 for ER here) changes nothing: accepted."""
    import json

    import yaml

    from stages.pipeline.trained import refuse_other_params
    from stages.runtime.config import from_dict

    record = json.loads((trained / "artifacts/train/run.json").read_text())
    assert record["params"]["train.lr"] == "auto" and record["settings"]["lr"] == 0.1
    params = yaml.safe_load((trained / "params.yaml").read_text())
    params["train"]["lr"] = 0.1
    refuse_other_params(from_dict(params), record)


def test_a_run_resumed_on_another_thread_count_says_so(tmp_path, trained, pbr):
    """A thread count moves a CPU run's results, and `train.threads: auto` follows the machine's load:
    a run resumed on another count kept only the last count, and read as a run of it alone."""
    import json

    import yaml

    repo = _copy_trained(trained, tmp_path / "repo")
    record = json.loads((repo / "artifacts/train/run.json").read_text())
    first = record["threads_by_task"][0]
    for k in (3, 4):
        shutil.rmtree(repo / f"artifacts/train/task_{k:02d}")
    (repo / "artifacts/train/accuracy.json").unlink()
    other = 3 if first != 3 else 2
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["train"]["threads"] = other
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    r = pbr(repo, "train")
    assert r.returncode == 0 and "resuming after task 3 of 5" in r.stdout, r.stderr[-2000:]
    after = json.loads((repo / "artifacts/train/run.json").read_text())
    assert after["threads_by_task"] == [first] * 3 + [other] * 2
    assert after["threads"] == ",".join(map(str, after["threads_by_task"]))


def test_a_run_resumed_under_auto_threads_keeps_its_count(tmp_path, trained, pbr, monkeypatch):
    """`train.threads: auto` follows the machine's load: a run killed and resumed while another
    process ran went on at another count, and ended with other metrics than the uninterrupted run
    (Class-IL 10.62 against 26.15 at one epoch). Under auto it now keeps its finished tasks' count."""
    import json

    import torch
    import yaml

    repo = _copy_trained(trained, tmp_path / "repo")
    run = repo / "artifacts/train/run.json"
    record = json.loads(run.read_text())
    then = 3  # not what auto picks on this machine's cores for one process (nor OMP_NUM_THREADS's)
    run.write_text(json.dumps({**record, "threads": then, "threads_by_task": [then] * 5}))
    for k in (3, 4):
        shutil.rmtree(repo / f"artifacts/train/task_{k:02d}")
    (repo / "artifacts/train/accuracy.json").unlink()
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["train"]["threads"] = "auto"
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    try:
        r = pbr(repo, "train")
    finally:
        torch.set_num_threads(before)
    assert r.returncode == 0 and "resuming after task 3 of 5" in r.stdout, r.stderr[-2000:]
    assert "resuming on the 3 thread(s) its finished tasks trained with" in r.stdout
    assert json.loads(run.read_text())["threads_by_task"] == [then] * 5


def test_a_setting_whose_auto_the_method_answers_later_is_not_refused_written_out():
    """PBR's mc_dropout: auto stays "auto" in the resolved settings (the trained dropout, answered
    when it scores): writing the value out (0.1) was refused as if the run had resolved 'auto'."""
    import torch
    import yaml

    from stages.runtime.run_settings import RunSettings
    from stages.pipeline.trained import refuse_other_params, trained_params
    from stages.runtime.config import from_dict

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    cfg = from_dict(params)
    record = {"params": trained_params(cfg), "settings": RunSettings.resolve(cfg, torch.device("cpu")).values}
    assert record["settings"]["mc_dropout"] == "auto"
    params["method"]["pbr"]["mc_dropout"] = 0.1
    refuse_other_params(from_dict(params), record)


@pytest.mark.parametrize("in_the_way", ["artifacts/score", "reports"])
def test_score_refuses_an_output_it_cannot_write_before_scoring(tmp_path, trained, pbr, in_the_way):
    """The score stage found an unwritable output folder only after scoring every task (minutes on
    the real data), with its scores file rewritten beside the old reports."""
    repo = _copy_trained(trained, tmp_path / "repo")
    shutil.rmtree(repo / in_the_way, ignore_errors=True)
    (repo / in_the_way).write_text("in the way")
    r = pbr(repo, "score")
    _one_line_error(r, in_the_way)
    assert "scored task" not in r.stdout and not (repo / "mlflow.db").exists()


def test_a_store_locked_past_sqlites_wait_is_one_line(tmp_path, monkeypatch, capsys):
    """Another process holding the sqlite store's lock past MLflow's 20 s wait (queue workers on a
    network file system): a SQLAlchemy traceback. The error here is sqlite's own, from a real lock."""
    import sqlite3

    from stages import cli

    db = tmp_path / "mlflow.db"
    holder = sqlite3.connect(db)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(sqlite3.OperationalError) as caught:
            sqlite3.connect(db, timeout=0).execute("CREATE TABLE runs (a)")
    finally:
        holder.rollback()
    monkeypatch.setattr(cli, "app", lambda **_: (_ for _ in ()).throw(caught.value))
    with pytest.raises(SystemExit) as code:
        cli._main()
    err = capsys.readouterr().err.strip().splitlines()
    assert code.value.code == 2 and len(err) == 1
    assert "could not be written: database is locked; other processes held its lock" in err[0]
    assert "MLflow server, docs/team.md" in err[0] and "what finished is kept" in err[0]
