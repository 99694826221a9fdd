import re
import subprocess
import sys

import pytest
import yaml

from conftest import ROOT
from pbr.errors import UserError
from pbr.methods import METHODS
from stages.runtime.config import Config, ConfigError, from_dict, load_config


def test_project_params_are_the_papers_headline_configuration():
    cfg = load_config(ROOT / "params.yaml")
    assert (cfg.data.dataset, cfg.data.setting, cfg.data.imbalance_ratio, cfg.data.n_tasks) == \
        ("cifar10", "ordered", 0.01, 5)
    assert (cfg.method.name, cfg.method.buffer_size) == ("pbr", 200)
    assert (cfg.train.epochs, cfg.train.batch_size) == (50, 32)
    from stages.pipeline.train import settings

    run = settings(cfg)
    s = run.values
    # The paper's head, tau2 and s; tau1 = 1, lr 0.1 and the walk's readings are the measured
    # defaults (docs/method.md).
    assert (s["lr"], s["head"], s["tau1"], s["tau2"], s["scale"]) == (0.1, "cosine", 1.0, 2.0, 10.0)
    assert (s["walk_candidate"], s["offset"], s["buffer_order"]) == ("hold", "task", "uncertain_weighted")
    assert cfg.model.width == 64
    # params.yaml spells out every key, so `dvc exp run -S` can set any of them (its Hydra overrides
    # refuse a key the file lacks), and the config holds the file's value of each, not a default.
    written = _leaves(yaml.safe_load((ROOT / "params.yaml").read_text()))
    missing = sorted(set(Config().flat(every_method=True)) - set(written))
    assert not missing, f"params.yaml lacks {missing}"
    assert {k: cfg.flat(every_method=True)[k] for k in written} == written
    # A run's params name its own method's keys only.
    assert not any(k.startswith(("method.der.", "method.ewc_on.")) for k in cfg.flat())


def _leaves(tree, prefix=""):
    """{'data.dataset': 'cifar10', ...}: the dotted key of every value written in a YAML mapping."""
    out = {}
    for k, v in tree.items():
        out.update(_leaves(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def test_per_task_epochs():
    cfg = from_dict({"train": {"epochs": [4, 8, 16, 40, 80]}})
    assert [cfg.epochs_of(k) for k in range(5)] == [4, 8, 16, 40, 80]
    assert from_dict({"train": {"epochs": 7}}).epochs_of(3) == 7
    assert cfg.flat()["train.epochs"] == [4, 8, 16, 40, 80]  # a list, as YAML and MLflow write it


def test_lr_milestones():
    assert from_dict({}).train.lr_milestones == "auto"  # the method's own
    assert from_dict({"train": {"lr_milestones": []}}).train.lr_milestones == ()  # a constant lr
    cfg = from_dict({"train": {"lr_milestones": [0.7, 0.9]}})
    assert cfg.train.lr_milestones == (0.7, 0.9) and cfg.flat()["train.lr_milestones"] == [0.7, 0.9]


def test_missing_keys_take_defaults():
    assert from_dict({"data": {"dataset": "cifar100", "n_tasks": 10}}).data.imbalance_ratio == 0.01
    assert from_dict({"data": {"dataset": "cifar100", "imbalance_ratio": 0.002}}).data.imbalance_ratio == 0.002
    assert from_dict({"data": {"imbalance_ratio": 0.0002}}).data.imbalance_ratio == 0.0002


BAD = [
    ({"data": {"dataset": "mnist"}}, r"data.dataset = 'mnist' .* one of cifar10 \| cifar100 \| tinyimagenet"),
    ({"data": {"setting": "random"}}, r"data.setting = 'random' .* ordered \| shuffled"),
    ({"data": {"imbalance_ratio": 0}}, r"data.imbalance_ratio = 0 .* 0 < IR <= 1"),
    ({"data": {"imbalance_ratio": 1.5}}, r"data.imbalance_ratio = 1.5 .* 0 < IR <= 1"),
    ({"data": {"imbalance_ratio": "0.01"}}, r"data.imbalance_ratio = '0.01'"),
    # int(5000 * 0.0001) = 0 images of the last class; int(5000 * 0.0002) = 1 (and 500 on CIFAR-100)
    ({"data": {"imbalance_ratio": 0.0001}}, r"data.imbalance_ratio = 0.0001 leaves cifar10's last class no .* >= 0.0002$"),
    ({"data": {"dataset": "cifar100", "imbalance_ratio": 0.001}}, r"leaves cifar100's last class no .* >= 0.002$"),
    ({"data": {"download": "yes"}}, r"data.download = 'yes' .* true or false"),
    ({"data": {"n_tasks": 0}}, r"data.n_tasks = 0 .* positive integer"),
    ({"data": {"n_tasks": 3}}, r"data.n_tasks = 3 does not divide the 10 classes of cifar10; use one of 1, 2, 5, 10"),
    ({"train": {"epochs": [5, 5]}}, r"train.epochs = \[5, 5\] has 2 entries but data.n_tasks = 5; give one entry per task"),
    ({"train": {"epochs": [5, 5, 0, 5, 5]}}, r"train.epochs = \[5, 5, 0, 5, 5\] .* list of positive integers"),
    ({"data": {"n_tasks": 2.5}}, r"data.n_tasks = 2.5"),
    ({"data": {"seed": True}}, r"data.seed = True .* an integer"),
    ({"data": {"root": ""}}, r"data.root = ''"),
    ({"data": {"shard_mb": -1}}, r"data.shard_mb = -1"),
    # Every registered method is offered (adding one must not break this test).
    ({"method": {"name": "nosuch"}}, r"method.name = 'nosuch' .* " + re.escape(" | ".join(METHODS))),
    ({"method": {"buffer_size": -5}}, r"method.buffer_size = -5 .* >= 0"),
    ({"train": {"epochs": 0}}, r"train.epochs = 0"),
    ({"train": {"batch_size": 1.0}}, r"train.batch_size = 1.0"),
    ({"train": {"lr": 0}}, r"train.lr = 0 .* a positive number or auto"),
    ({"train": {"lr": "fast"}}, r"train.lr = 'fast'"),
    # fractions of a task's epochs, strictly increasing, inside (0, 1): a list, [] for a constant lr
    *((({"train": {"lr_milestones": v}}), re.escape(f"train.lr_milestones = {v!r} is not allowed; it must be auto, or a "
                                                      "list of strictly increasing fractions of a task's epochs in (0, 1) "
                                                      "([] for a constant lr)") + "$")
      for v in ([0.9, 0.7], [0.7, 0.7], [0, 0.5], [0.5, 1], [35, 45], 0.7, "0.7, 0.9", [0.7, "x"], [True], "constant")),
    ({"model": {"dropout": 1.0}}, r"model.dropout = 1.0 .* \[0, 1\) or auto"),
    ({"model": {"head": "mlp"}}, r"model.head = 'mlp' .* auto \| cosine \| linear"),
    ({"method": {"pbr": {"alpha": -1}}}, r"method.pbr.alpha = -1"),
    ({"method": {"pbr": {"buffer_order": "max"}}}, r"method.pbr.buffer_order = 'max'"),
    # The flat spelling of before each method's keys moved under its name.
    ({"method": {"tau1": 0.1}}, r"'method.tau1' is now spelled 'method.pbr.tau1' .* move it there$"),
    ({"method": {"alpha": 1}}, r"'method.alpha' is now spelled 'method.lwf.alpha' or 'method.fdr.alpha' or "
                               r"'method.der.alpha' or 'method.derpp.alpha' or 'method.pbr.alpha'"),
    ({"method": {"der": {"tau1": 1}}}, r"unknown key 'method.der.tau1'; allowed in 'method.der': alpha$"),
    ({"method": {"name": "er", "buffer_size": 0}}, r"method.buffer_size = 0 leaves er without a replay buffer"),
    # Herding keeps capacity // classes seen a class: below a slot a class, iCaRL's memory emptied
    # and it crashed at the task where that happened (hours in on CIFAR-100 at buffer 50).
    ({"method": {"name": "icarl", "buffer_size": 9}}, r"method.buffer_size = 9 is too small for icarl on cifar10's 10 "
                                                      r"classes in 5 tasks: its memory needs a slot per class .* at least 10$"),
    ({"method": {"name": "hal", "buffer_size": 4, "hal": {"hal_memory": "ring"}}},
     r"method.buffer_size = 4 is too small for hal .* a slot per task \(a ring per task\); use at least 5$"),
    ({"train": {"device": "tpu"}}, r"train.device = 'tpu' .* auto \| cpu \| cuda"),
    ({"model": {"width": -1}}, r"model.width = -1"),
    ({"seed": "x"}, r"seed = 'x'"),
    ({"data": {"datset": "cifar10"}}, r"unknown key 'data.datset' \(did you mean 'data.dataset'\?\)"),
    ({"trian": {}}, r"unknown key 'trian' \(did you mean 'train'\?\)"),
    ({"data": 5}, r"data must be a mapping"),
    ([1, 2], r"the file must be a mapping"),
]


@pytest.mark.parametrize("raw,msg", BAD, ids=[m[:30] for _, m in BAD])
def test_bad_values_name_the_key_and_what_is_allowed(raw, msg):
    with pytest.raises(ConfigError, match=msg) as e:
        from_dict(raw)
    assert "\n" not in str(e.value)


def test_cli_prints_one_line_and_no_traceback(tmp_path):
    (tmp_path / "params.yaml").write_text("data:\n  imbalance_ratio: 2\n")
    r = subprocess.run([sys.executable, "-m", "stages.cli", "prepare"], cwd=tmp_path, capture_output=True,
                       text=True, env=_env())
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "error: params.yaml: data.imbalance_ratio = 2 is not allowed; it must be a number with 0 < IR <= 1 "
        "(1 = balanced)"]
    assert not (tmp_path / "data").exists()


def test_cli_on_bad_yaml_and_missing_file(tmp_path, pbr_main):
    """In this process (conftest's pbr_main: the same main()); the process above prints one such error."""
    (tmp_path / "params.yaml").write_text("data: [unclosed\n")
    r = pbr_main("prepare", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith("error: params.yaml: not valid YAML at line")
    r = pbr_main("prepare", "-p", "nope.yaml", cwd=tmp_path)
    assert r.returncode == 2 and "nope.yaml: no such parameters file" in r.stderr
    # a key given twice took the last value without a word; a Latin-1 comment gave a traceback
    (tmp_path / "params.yaml").write_text("seed: 0\ndata:\n  n_tasks: 5\nseed: 1\n")
    r = pbr_main("prepare", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr == "error: params.yaml: the key 'seed' is given twice at line 4; keep one of them\n"
    (tmp_path / "params.yaml").write_bytes("seed: 0  # café\n".encode("latin-1"))
    r = pbr_main("prepare", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr == "error: params.yaml: not UTF-8 text (byte 14); save it as UTF-8\n"
    # the same key in two sections is two keys; a merge key's values may be overridden, as in YAML
    (tmp_path / "params.yaml").write_text("data:\n  seed: 3\nseed: 1\n")
    assert load_config(tmp_path / "params.yaml").data.seed == 3
    (tmp_path / "params.yaml").write_text("train: &t\n  epochs: 2\n  lr: 0.1\nmodel: {width: 8}\n"
                                          "x-other: &o\n  <<: *t\n  epochs: 3\n")
    with pytest.raises(ConfigError, match="x-other"):  # the merge itself loads; the unknown section is named
        load_config(tmp_path / "params.yaml")
    (tmp_path / "params.yaml").write_text("[a, b]: 1\n")  # an unhashable key: yaml's own error, one line
    r = pbr_main("prepare", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith("error: params.yaml: not valid YAML at line 1")


def test_help_is_fast_and_imports_no_torch():
    code = "import sys, stages.cli; assert 'torch' not in sys.modules and 'mlflow' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, env=_env())


def _env():
    import os

    return {**os.environ, "PYTHONPATH": str(ROOT)}


def test_auto_values_come_from_the_published_table_of_the_runs_dataset_and_buffer():
    """Mammoth's best_args (seq-cifar10 / seq-tinyimg / seq-cifar100) key DER++'s alpha and beta by
    dataset and buffer; a pair it does not list falls back to the method's default, and says so."""
    from stages.pipeline.train import settings

    def derpp(dataset, buffer):
        run = settings(from_dict({"data": {"dataset": dataset, "n_tasks": 5},
                                  "method": {"name": "derpp", "buffer_size": buffer}}))
        s, sources = run.values, run.sources
        return (s["lr"], s["alpha"], s["beta"]), sources["alpha"]

    assert derpp("cifar10", 200)[0] == (0.03, 0.1, 0.5)
    assert derpp("cifar10", 500)[0] == (0.03, 0.2, 0.5)
    assert derpp("tinyimagenet", 200)[0] == (0.03, 0.1, 1.0)  # not Seq-CIFAR-10's beta 0.5
    assert "seq-tinyimg" in derpp("tinyimagenet", 200)[1]
    # Mammoth lists seq-cifar100 at buffer 500 and 2000 only: 200 takes 500's (one Table 2 row, one
    # setting in both its buffer columns), a buffer it lists for no data set the method's default.
    values, source = derpp("cifar100", 200)
    assert values == (0.03, 0.1, 0.5) and "seq-cifar100 buffer 500 (best_args has no 200)" in source
    values, source = derpp("cifar100", 5120)
    assert values == (0.03, 0.1, 0.5) and "no published value" in source
    run = settings(from_dict({"data": {"dataset": "tinyimagenet"}, "method": {"name": "er", "buffer_size": 500}}))
    s, sources = run.values, run.sources
    assert s["lr"] == 0.03 and "seq-tinyimg" in sources["lr"]  # ER's tuned 0.1 is Seq-CIFAR-10's
    run = settings(from_dict({"method": {"name": "er"}, "train": {"lr": 0.05}}))
    s, sources = run.values, run.sources
    assert s["lr"] == 0.05 and sources["lr"] == "params"


def test_a_method_key_left_out_of_params_yaml_is_recorded_as_its_declared_default():
    """run.json's `sources` (and the MLflow tags source.*): a key params.yaml leaves out (a method's
    section not shipped yet) took the method's declared default, no value of params'; one written,
    even at that value, is params'. The shared method.reservoir alike."""
    from stages.pipeline.train import settings

    def sources(method):
        return settings(from_dict({"method": method, "train": {"device": "cpu", "precision": "fp32"}})).sources

    declared = "the method's declared default"
    left_out = sources({"name": "lwf"})
    assert (left_out["tau2"], left_out["warmup_epochs"]) == (declared, declared)
    assert "best_args" in left_out["alpha"]  # auto: the published best, as before
    written = sources({"name": "lwf", "lwf": {"tau2": 2.0}})
    assert (written["tau2"], written["warmup_epochs"]) == ("params", declared)
    assert (sources({"name": "er"})["reservoir"], sources({"name": "er", "reservoir": "every_epoch"})["reservoir"]) == \
        (declared, "params")
    run = settings(from_dict({"method": {"name": "gem"}, "train": {"device": "cpu"}}))
    assert run.tags()["source.gem_memory"] == declared and run.values["gem_memory"] == "per_task"


def test_a_new_method_declares_its_settings_in_its_own_file(monkeypatch):
    """The method section is built from the registry: a registered method's setting is a
    validated params.yaml key under the method's name, without an edit to the config, even when
    another method declares the same key otherwise (oEWC's gamma, PBR's tau1)."""
    from pbr.methods import METHODS, ContinualMethod, Setting
    from stages.runtime import config

    class Toy(ContinualMethod):
        name = "toy"
        settings = (Setting("gamma", float, 2.0, "how strong", lambda v: v > 0, "a positive number"),
                    Setting("tau1", int, 5, "another type and default than PBR's tau1"))

    monkeypatch.setitem(METHODS, "toy", Toy)
    MethodConfig = config._method_config()
    monkeypatch.setattr(config, "MethodConfig", MethodConfig)
    cfg = config._build(MethodConfig, {"name": "toy", "toy": {"gamma": 3}}, "method.", "params.yaml")
    assert (cfg.name, cfg.toy.gamma, cfg.toy.tau1, cfg.ewc_on.gamma, cfg.pbr.tau1) == ("toy", 3.0, 5, "auto", "auto")
    assert config.method_values(cfg) == {"gamma": 3.0, "tau1": 5}
    with pytest.raises(ConfigError, match=r"method.toy.gamma = -1 .* a positive number"):
        config._build(MethodConfig, {"toy": {"gamma": -1}}, "method.", "params.yaml")
    with pytest.raises(ConfigError, match=r"'method.gamma' is now spelled 'method.ewc_on.gamma' or 'method.toy.gamma'"):
        config._build(MethodConfig, {"gamma": 1}, "method.", "params.yaml")

    class Clash(ContinualMethod):
        name = "clash"
        settings = (Setting("reservoir", str, "always", "another rule for the shared key", shared=True),)

    monkeypatch.setitem(METHODS, "clash", Clash)
    with pytest.raises(TypeError, match="method.reservoir is shared but declared differently"):
        config._method_config()


def test_params_read_as_dvc_writes_and_reads_them(tmp_path):
    """`dvc exp run -S` writes params.yaml through DVC's own override code (ruamel, YAML 1.2):
    `train.lr=1e-5` becomes `lr: 1e-05`, which YAML 1.1 (PyYAML's SafeLoader) reads as the string
    '1e-05', refused as not a number. And the values YAML 1.1 reads otherwise than DVC does (its
    dvc.lock and `dvc exp show` records of the run) are read as DVC reads them."""
    from dvc.utils.hydra import apply_overrides
    from ruamel.yaml import YAML

    p = tmp_path / "params.yaml"
    p.write_text((ROOT / "params.yaml").read_text())
    apply_overrides(p, ["train.lr=1e-5", "method.pbr.mi_outliers=0.00005"])
    p.write_text(p.read_text().replace("\nseed: 0", "\nseed: 010"))
    cfg = load_config(p)
    assert cfg.train.lr == 1e-5 and cfg.method.pbr.mi_outliers == 5e-5 and cfg.seed == 10
    dvc_reads = YAML(typ="safe").load(p.read_text())
    assert (dvc_reads["train"]["lr"], dvc_reads["seed"]) == (cfg.train.lr, cfg.seed)
    # YAML 1.1's yes, octal 010 and sexagesimal 1:30 are a string, 10 and a string to DVC
    p.write_text("seed: 1:30\n")
    with pytest.raises(ConfigError, match="seed = '1:30'"):
        load_config(p)
    p.write_text("data:\n  download: yes\n")
    with pytest.raises(ConfigError, match="data.download = 'yes'"):
        load_config(p)
    p.write_text("data:\n  shard_mb: 1" + "0" * 400 + "\n")  # beyond a float: OverflowError before
    with pytest.raises(ConfigError, match="data.shard_mb = 10+ is not allowed"):
        load_config(p)
    # a sweep's own key=value options read their values the same way
    from stages.experiments.sweep import parse_assignments

    assert parse_assignments(["train.lr=1e-5", "seed=010"], "--only") == {"train.lr": 1e-5, "seed": 10}


@pytest.mark.parametrize("text", ["1e-05", ".5", "+.5", "1.", "1.e5", "-3", "+12", "010", "0777", "0o17", "0x1F",
                                  "-0x1F", "0b101", "5_120", "1_000.5", "1_0e1_0", "-.inf", ".NaN", "yes", "on",
                                  "True", "false", "1:30", "2026-11-28", "~", "null", "0b", "0x", "0x_1F", "0b1_",
                                  "0o_7", "-0x_f"])
def test_a_value_reads_as_dvc_reads_it(text):
    """DVC reads params.yaml with ruamel: every value reads to the same Python value and type here."""
    from ruamel.yaml import YAML

    from stages.runtime.yaml12 import read_yaml

    dvc, ours = YAML(typ="safe").load(f"a: {text}")["a"], read_yaml(f"a: {text}")["a"]
    assert type(ours) is type(dvc) and (ours == dvc or (ours != ours and dvc != dvc)), (ours, dvc)


@pytest.mark.parametrize("text", ["0x_", "0b_", "0o_", "-0x_", "+0b__"])
def test_a_radix_prefix_without_a_digit_is_no_integer(tmp_path, pbr_main, text):
    """`0x_` read as an integer failed in int() (a 159-line traceback; ruamel's own reading of it, DVC's,
    fails the same way): it is a string, which the key then refuses in one line."""
    (tmp_path / "bad.yaml").write_text(f"seed: {text}\n")
    r = pbr_main("train", "-p", "bad.yaml", cwd=tmp_path)
    assert (r.returncode, r.stderr) == (2, f"error: bad.yaml: seed = '{text}' is not allowed; it must be an integer "
                                            "in [0, 2^32) (the training seed)\n")


def test_a_scalar_that_reads_as_no_date_is_one_line(tmp_path, pbr_main):
    """YAML reads 2026-13-45 as a date, which datetime refuses with a ValueError (as DVC's ruamel does)."""
    from stages.experiments.sweep import parse_assignments

    (tmp_path / "bad.yaml").write_text("train:\n  epochs: 2\nseed: 2026-13-45\n")
    r = pbr_main("train", "-p", "bad.yaml", cwd=tmp_path)
    assert (r.returncode, r.stderr) == (2, "error: bad.yaml: the value '2026-13-45' cannot be read (month must be in "
                                            "1..12) at line 3; fix or quote it\n")
    with pytest.raises(UserError, match=r"^-S 'seed=2026-13-45': the value is not valid YAML$"):
        parse_assignments(["seed=2026-13-45"], "-S")


def test_a_yaml_version_directive_other_than_1_2_is_refused(tmp_path, pbr_main):
    """Under `%YAML 1.1` DVC's ruamel reads `seed: 010` as 8, pbr read 10: two seeds for one run. Only
    pbr's side is asserted: ruamel's reading depends on its C loader (ruamel.yaml.clib, which 0.18
    always installs and 0.19 not: with it, 10)."""
    (tmp_path / "bad.yaml").write_text("%YAML 1.1\n---\nseed: 010\n")
    r = pbr_main("train", "-p", "bad.yaml", cwd=tmp_path)
    assert (r.returncode, r.stderr) == (2, "error: bad.yaml: a %YAML 1.1 directive, which DVC reads the file by (in "
                                            "1.1, 010 is 8 and yes is true) and pbr does not (YAML 1.2 always); "
                                            "remove the line\n")
    # 1.2 is how both read it anyway
    (tmp_path / "ok.yaml").write_text("%YAML 1.2\n---\nseed: 010\n")
    assert load_config(tmp_path / "ok.yaml").seed == 10


@pytest.mark.parametrize("text,said", [
    ("train:\n  lr: 0.1\n  epochs:2\n", "at line 3: could not find expected ':'"),  # was line 4 of 3
    ("train:\n\tlr: 0.1\n", "at line 2: found character '\\t' that cannot start any token"),
    ("data: [unclosed\n", "at line 1: expected ',' or ']', but got '<stream end>'"),
    ("a: 1\n---\nb: 2\n", "at line 2: expected a single document in the stream, but found another document"),
])
def test_a_yaml_syntax_error_says_the_parsers_reason_at_its_line(tmp_path, pbr_main, text, said):
    (tmp_path / "params.yaml").write_text(text)
    r = pbr_main("train", cwd=tmp_path)
    assert (r.returncode, r.stderr) == (2, f"error: params.yaml: not valid YAML {said}; fix the syntax\n")


def test_a_folder_given_as_the_parameters_file_is_said_to_be_one(tmp_path, pbr_main):
    """`pbr train -p FOLDER` said "no such parameters file" of a folder that is there."""
    r = pbr_main("train", "-p", str(tmp_path), cwd=tmp_path)
    assert (r.returncode, r.stderr) == (2, f"error: {tmp_path}: a folder, not a parameters file; pass a file: "
                                            "--params FILE\n")
    (tmp_path / "params.yaml").write_text("seed: 0\n")
    r = pbr_main("sweep", "table3", "-p", str(tmp_path), "--dry-run", cwd=tmp_path)
    assert (r.returncode, r.stderr) == (2, f"error: {tmp_path}: a folder, not a parameters file; pass the one in "
                                            f"it: --params {tmp_path / 'params.yaml'}\n")


@pytest.mark.parametrize("text,said", [
    ("train:\n  lr:0.1\n", "train must be a mapping of keys to values; it is the text 'lr:0.1': a space after the "
                           "colon? (key: value)"),
    ("seed:0\n", "the file must be a mapping of keys to values; it is the text 'seed:0': a space after the colon? "
                 "(key: value)"),
    ("train: {lr:0.1}\n", "unknown key 'train.lr:0.1' (a space after the colon?); allowed in 'train': epochs,"),
])
def test_a_colon_without_its_space_is_hinted_at(tmp_path, text, said):
    """`lr:0.1` is YAML's text "lr:0.1", and the error said only that train must be a mapping."""
    (tmp_path / "params.yaml").write_text(text)
    with pytest.raises(ConfigError) as e:
        load_config(tmp_path / "params.yaml")
    assert str(e.value).startswith(f"{tmp_path / 'params.yaml'}: {said}"), str(e.value)


def test_a_config_replaced_by_hand_resolves_its_own_values():
    """Only a Config read from a file knows which keys it wrote: one built or replaced in code (a
    library user's, a script's) resolved its method's declared defaults instead of its values."""
    import dataclasses

    from stages.runtime.config import load_config
    from stages.runtime.run_settings import RunSettings
    import types

    cfg = load_config(ROOT / "params.yaml")
    pbr_section = dataclasses.replace(cfg.method.pbr, tau1=0.25)
    cfg2 = dataclasses.replace(cfg, method=dataclasses.replace(cfg.method, pbr=pbr_section))
    s = RunSettings.resolve(cfg2, types.SimpleNamespace(type="cpu"))
    assert s["tau1"] == 0.25 and s.sources["tau1"] == "params"
