"""The paper's grids as DVC experiment runs (planning only; test_sweep_dvc queues and runs them)."""

import re

import pytest

from conftest import ROOT
from pbr.errors import UserError
from stages.experiments import sweep
from stages.experiments.paper_results import PAPER_RESULTS
from stages.experiments.report import buffer_of, method_label

PARAMS = ROOT / "params.yaml"


def _plan(grid, seeds=1, extra=None, only=None, budget="full"):
    return sweep.plan(grid, seeds, extra or {}, only or {}, PARAMS, budget)


def _table2_rows_per_dataset():
    """The bounds at IR 0.01 and 1, the other baselines once (no buffer) or at buffers 200 and 500,
    and PBR as "Ours" and "Ours - Random" (in both readings: the walk in random order, the online
    reservoir) at both buffers: whatever the registry holds."""
    from pbr.methods import METHODS

    bounds = sum(c.role == "bound" for c in METHODS.values())
    plain = sum(c.role == "baseline" and not c.uses_buffer for c in METHODS.values())
    rehearsal = sum(c.role == "baseline" and c.uses_buffer for c in METHODS.values())
    return 2 * bounds + plain + 2 * (rehearsal + 3)


def _n_methods():
    from pbr.methods import METHODS

    return len(METHODS)


@pytest.mark.parametrize("grid,per_seed", [("table1", 2), ("table2", 3 * _table2_rows_per_dataset()), ("table3", 8),
                                           ("table5", 8),
                                           ("families", 2 * _n_methods())])
def test_grid_sizes_and_unique_names(grid, per_seed):
    runs = _plan(grid, seeds=5)
    assert len(runs) == 5 * per_seed
    assert len({r.name for r in runs}) == len(runs)
    assert sorted({r.overrides["seed"] for r in runs}) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("grid", ["table1", "table2", "table3", "table5"])
def test_every_run_lands_on_a_row_of_the_papers_table(grid):
    """The report's key of each run is one the paper prints (Table 5's no-buffer cosine row aside;
    methods the paper never ran, such as the label-count buffers PRS and CBRS, have no row)."""
    from pbr.methods import METHODS

    in_paper = {key[3] for key in PAPER_RESULTS}
    for r in _plan(grid):
        p = {k: str(v) for k, v in r.overrides.items()}
        key = (p["data.setting"], float(p["data.imbalance_ratio"]), p["data.dataset"], method_label(p), buffer_of(p))
        if key[3] == "SGD (cosine)" or key[3] not in in_paper:
            assert key[3] == "SGD (cosine)" or METHODS[p["method.name"]].label not in in_paper, key
            continue
        assert key in PAPER_RESULTS, (r.name, key)


def test_only_and_set():
    runs = _plan("table3", seeds=2, extra={"train.epochs": 1}, only={"data.imbalance_ratio": [0.1, 0.05]})
    assert len(runs) == 8
    assert {r.overrides["data.imbalance_ratio"] for r in runs} == {0.1, 0.05}
    assert all(r.overrides["train.epochs"] == 1 for r in runs)
    # Settings beyond the grid make another experiment name: a quick sweep never shadows a full one.
    assert all(r.name not in {x.name for x in _plan("table3", seeds=2)} for r in runs)
    # Where a machine finds the raw data is not a setting: the same runs, by the same names.
    here = _plan("table3", seeds=2, extra={"data.root": "/scratch/me/datasets", "data.download": False})
    assert [r.name for r in here] == [r.name for r in _plan("table3", seeds=2)]
    assert here[0].overrides["data.root"] == "/scratch/me/datasets"
    assert "-S train.epochs=1 " in runs[0].command()


def test_a_dry_run_command_pastes_into_a_shell():
    """Each -S value is quoted for the shell only where it needs it: a quote or a space in a value
    (a data.root) survives the paste, and plain values print bare."""
    import shlex

    run = _plan("fidelity", extra={"data.root": "/data/bob's disk"}, only={"row": ["pbr"]}, budget="proxy")[0]
    line = run.command()
    words = shlex.split(line)
    assert words[:6] == ["dvc", "exp", "run", "--queue", "-n", "fid-pbr-s0-proxy"]
    assert words[6::2] == ["-S"] * len(run.set_params())
    assert words[7::2] == run.set_params() and "data.root='/data/bob\\'s disk'" in words
    assert "-S method.name=pbr -S model.width=8 -S 'train.epochs=[4, 8, 16, 40, 80]' " in line
    assert """-S "data.root='/data/bob\\\\'s disk'" """ in line


# Roots Hydra's override grammar (DVC's -S) lexes otherwise bare: ~ # = fail to parse, a comma is a
# sweep of two experiments, a quote or a backslash before one is an escape, ${...} an interpolation.
AWKWARD_ROOTS = ["~/raw", "/x/raw,2", "/x/a#b", "/x/a=b", "/x/my data", "/x/bob's", '/x/q"x', "C:\\data\\",
                 "/x/it\\'s", "/x/${HOME}", "/x/1.5", "true", "null", "/x/$(echo hi)!"]


@pytest.mark.parametrize("root", AWKWARD_ROOTS)
def test_a_string_value_reaches_params_yaml_exactly_through_dvc(tmp_path, root):
    """DVC parses each -S with Hydra, sweeps over a comma, and writes params.yaml: the value it writes
    is the one given, in one experiment; the dry-run line reads back as the same -S words."""
    from dvc.utils.hydra import apply_overrides, get_hydra_sweeps

    from stages.runtime.config import load_config

    run = _plan("families", extra={"data.root": root}, only={"method.name": ["sgd"], "data.imbalance_ratio": [1.0]},
                budget="quick")[0]
    assert len(get_hydra_sweeps({"params.yaml": run.set_params()})) == 1
    (tmp_path / "params.yaml").write_text(PARAMS.read_text())
    apply_overrides(str(tmp_path / "params.yaml"), run.set_params())
    assert load_config(tmp_path / "params.yaml").data.root == root
    import subprocess

    pasted = subprocess.run(["bash", "-c", 'dvc() { printf "%s\\0" "$@"; }; ' + run.command()], capture_output=True,
                            text=True, check=True).stdout  # bash's own reading of the line
    assert pasted.split("\0")[6:-1:2] == run.set_params()


def test_a_methods_key_params_yaml_lacks_is_swept_as_dvc_exp_run_takes_it(tmp_path):
    """A method runs before its section is in params.yaml (the checklist's step 4); `-S` of one of its
    keys, spelled bare or with Hydra's `++` as `dvc exp run` needs it, planned fine but DVC's writer
    refused it (struct mode: "Invalid --set-param value") or the plan did ("unknown key '++method'").
    The sweep writes `++` for the keys params.yaml lacks only, and both spellings are one run."""
    from dvc.utils.hydra import apply_overrides

    from stages.runtime.config import load_config

    params = tmp_path / "params.yaml"
    params.write_text(re.sub(r"\n  gem:\n(    .*\n)+", "\n", PARAMS.read_text()))
    assert "gem:" not in params.read_text()
    only = {"method.name": ["gem"], "data.imbalance_ratio": [0.01]}
    runs = [sweep.plan("families", 1, {key: 0.3}, only, params)[0] for key in ("method.gem.margin", "++method.gem.margin")]
    assert runs[0] == runs[1]
    assert runs[0].set_params()[:2] == ["data.dataset=cifar10", "data.n_tasks=5"]  # params.yaml's own keys: bare
    assert "method.name=gem" in runs[0].set_params() and "++method.gem.margin=0.3" in runs[0].set_params()
    assert " -S ++method.gem.margin=0.3" in runs[0].command()
    apply_overrides(str(params), runs[0].set_params())
    cfg = load_config(params)
    assert (cfg.method.name, cfg.method.gem.margin, cfg.method.gem.gem_memory) == ("gem", 0.3, "per_task")


@pytest.mark.parametrize("args,msg", [
    (("table4", 1, {}, {}), "sweep 'table4' is not a grid; use one of table1 | table2 | table3 | table5 | fidelity | families"),
    (("table3", 0, {}, {}), "--seeds 0"),
    (("table3", 1, {"method.buffer_size": -3}, {}), "sweep table3: params.yaml: method.buffer_size = -3"),
    (("table3", 1, {}, {"foo.bar": [1]}), "--only foo.bar: no such parameter"),
    (("table3", 1, {}, {"method.name": ["er"]}), "--only method.name=er: no run of table3 has it"),
    (("table2", 1, {}, {"data.imbalance_ratio": [1], "method.name": ["er"]}),
     "--only data.imbalance_ratio=1 method.name=er: no run of table2 matches"),
])
def test_bad_sweeps_are_one_line_errors(args, msg):
    with pytest.raises(UserError, match=msg.replace("(", r"\(").replace("|", r"\|").replace("+", r"\+")):
        sweep.plan(*args, PARAMS)


def test_an_only_value_no_run_has_is_named_not_dropped():
    """A mistyped --only value would leave its runs out while the rest are queued."""
    def only(*items):
        return sweep.parse_assignments(list(items), "--only", many=True)

    with pytest.raises(UserError) as e:
        _plan("fidelity", only=only("row=pbr,pbr-reservior"))
    assert str(e.value).startswith("--only row=pbr-reservior: no run of fidelity has it (rows: er-lr0.03, er-lr0.1, ")
    assert str(e.value).endswith(", pbr, pbr-random, pbr-reservoir, pbr-literal)")
    with pytest.raises(UserError, match=r"^--only method.name=dre\+\+: no run of table2 has it \(values of "
                                        r"method.name: joint, sgd, .*derpp.*\)$"):
        _plan("table2", only=only("method.name=pbr,dre++", "data.dataset=cifar10"))
    with pytest.raises(UserError) as e:
        _plan("table3", only=only("data.imbalance_ratio=0.01,0.2", "method.name=pbr,er"))
    assert str(e.value) == ("--only data.imbalance_ratio=0.2: no run of table3 has it (values of data.imbalance_ratio: "
                            "0.01, 0.02, 0.05, 0.1); --only method.name=er: no run of table3 has it (values of "
                            "method.name: derpp, pbr)")
    with pytest.raises(UserError, match="^--only row: table3 names no rows"):
        _plan("table3", only=only("row=pbr"))
    # Values compare as numbers, as the filter compares them: 1e-1 is table 3's IR 0.1, 1 families' IR 1.0.
    assert len(_plan("table3", only=only("data.imbalance_ratio=0.01,1e-1"))) == 4
    assert {r.overrides["data.imbalance_ratio"] for r in _plan("families", only=only("data.imbalance_ratio=1"))} == {1.0}


def test_a_run_two_tables_share_is_one_experiment():
    """Names follow the settings, not the grid: a sweep of table 1 after table 2 finds its PBR run."""
    def names(grid, **only):
        return {r.name: r.overrides for r in _plan(grid, only=only)}

    t1, t2 = names("table1"), names("table2", **{"data.dataset": "cifar100"})
    shared = set(t1) & set(t2)
    assert shared == {"c100-pbr-b500-ord-ir0.01-s0"}, shared
    # Table 5's cosine PBR is table 2's PBR (cosine is PBR's own head), its linear SGD is table 2's
    # SGD; its linear PBR and cosine SGD are its own.
    t5, t2 = names("table5"), names("table2", **{"data.dataset": "cifar10"})
    assert set(t5) & set(t2) == {"c10-pbr-b200-ord-ir0.01-s0", "c10-pbr-random-b200-ord-ir0.01-s0",
                                 "c10-pbr-reservoir-b200-ord-ir0.01-s0", "c10-sgd-ord-ir0.01-s0"}
    assert t5["c10-sgd-cosine-ord-ir0.01-s0"]["model.head"] == "cosine"
    assert t5["c10-pbr-linear-b200-ord-ir0.01-s0"]["model.head"] == "linear"
    # Distinct runs keep distinct names within every grid.
    for grid in ("table1", "table2", "table3", "table5"):
        runs = _plan(grid, seeds=2)
        assert len({r.name for r in runs}) == len(runs), grid


def test_cli_dry_run(tmp_path, pbr_main):
    (tmp_path / "params.yaml").write_text(PARAMS.read_text())
    r = pbr_main("sweep", "table5", "--seeds", "2", "--dry-run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 16 and all(x.startswith("dvc exp run --queue -n c10-") for x in lines)
    # An offline sweep uses no DVC queue: its plan is each run's folder and its values.
    r = pbr_main("sweep", "table5", "--seeds", "1", "--offline", "out", "--dry-run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 8 and all(x.startswith("out/runs/c10-") and "method.name=" in x for x in lines)
    assert "dvc" not in r.stdout and not (tmp_path / "out").exists()
    r = pbr_main("sweep", "table3", "-S", "train.epochs", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip() == (
        "error: -S 'train.epochs': write it as key=value, e.g. -S train.epochs=5")


def test_fidelity_grid_at_the_proxy_budget():
    runs = _plan("fidelity", seeds=3, budget="proxy")
    # 35 cells a seed, by hand: ER at lr 0.03 and 0.1 (2); order x offset, 6 less params.yaml's
    # task-offset random order (5); the one-at-a-time readings: kl, mi, tau1, alpha 2, beta 2, lr,
    # imprint, advance, N-stream, certain_weighted, mi_power 2, rank, outliers, teacher, evict 2,
    # pool, mc_dropout, T, mi_epochs 5, mc_backbone (24); PBR, its two ablations and pbr-literal (4).
    assert len(runs) == 3 * (2 + 5 + 24 + 4) and len({r.name for r in runs}) == len(runs)
    # No cell repeats another's settings (the order x offset cells skip params.yaml's own PBR).
    settings = [tuple(sorted((k, str(v)) for k, v in r.overrides.items())) for r in runs]
    assert len(set(settings)) == len(settings)
    by_name = {r.name: r.overrides for r in runs}
    er = by_name["fid-er-lr0.03-s2-proxy"]
    assert er["method.name"] == "er" and er["train.lr"] == 0.03 and er["seed"] == 2
    # The budget is on every run, and a cell's own setting wins over it.
    assert all(o["model.width"] == 8 and o["train.epochs"] == [4, 8, 16, 40, 80] for o in by_name.values())
    assert all(o["method.reservoir"] == "first_epoch" for o in by_name.values())
    cell = by_name["fid-pbr-certain-task-s0-proxy"]
    assert (cell["method.pbr.buffer_order"], cell["method.pbr.offset"]) == ("certain_first", "task")
    # One change at a time: a cell for every value of a reading other than the one PBR runs with
    # (params.yaml leaves them auto: the tuned preset's tau1 1 and held candidate).
    assert [r.overrides["method.pbr.tau1"] for r in runs if r.name.startswith("fid-pbr-tau1-")] == [0.1] * 3
    assert not any(r.name.startswith("fid-pbr-hold-") for r in runs)
    assert sum(r.name.startswith("fid-pbr-advance-") for r in runs) == 3
    # The paper as written, beside ours: every auto key under the paper preset, nothing else set.
    literal = by_name["fid-pbr-literal-s1-proxy"]
    assert literal["method.pbr.preset"] == "paper" and "method.pbr.tau1" not in literal and "train.lr" not in literal
    assert any(r.name.startswith("fid-pbr-kl") for r in runs) and any(r.name.startswith("fid-pbr-mi") for r in runs)
    assert "-S 'train.epochs=[4, 8, 16, 40, 80]'" in runs[0].command()
    picked = _plan("fidelity", seeds=2, budget="proxy", only={"row": ["pbr", "er-lr0.1"]})
    assert sorted(r.name for r in picked) == ["fid-er-lr0.1-s0-proxy", "fid-er-lr0.1-s1-proxy",
                                              "fid-pbr-s0-proxy", "fid-pbr-s1-proxy"]
    # The full budget keeps params.yaml's epochs and width, under names of their own.
    full = _plan("fidelity", seeds=1)
    assert all("model.width" not in r.overrides and not r.name.endswith("proxy") for r in full)


def test_the_fidelity_grid_is_what_the_proposed_method_declares(monkeypatch):
    """The grid names no method's keys: the method of role "ours" has its readings in pbr/readings.py
    (out of the code that shapes the weights), and a changed list is an edit there, not of the sweep."""
    from pbr import readings

    monkeypatch.setitem(readings.READINGS, "pbr", readings.Readings(
        pair=(("offset", ("task", "class")), ("walk_rank", ("task", "class"))), one_at_a_time={"alpha": ("a", (0.3, 1.0))}))
    names = sorted(r.name for r in _plan("fidelity", seeds=1))
    # The pair: 2 x 2 less PBR's own (offset task, rank task); alpha 0.3 (1.0 is PBR's); PBR and its
    # two ablations; ER at two lrs; no literal row.
    assert names == sorted(["fid-er-lr0.03-s0", "fid-er-lr0.1-s0", "fid-pbr-class-task-s0", "fid-pbr-task-class-s0",
                            "fid-pbr-class-class-s0", "fid-pbr-a0.3-s0", "fid-pbr-s0", "fid-pbr-random-s0",
                            "fid-pbr-reservoir-s0"])


def test_the_fidelity_grid_tries_each_reading_of_the_paper_preset():
    """The grid measures the paper's open readings: every key the paper preset sets is tried at the
    paper's value, in the pair or one at a time (train.lr for the preset's lr), so no reading of the
    paper goes unmeasured beside the tuned one."""
    from pbr.methods.pbr import PBR
    from pbr.readings import READINGS

    readings = READINGS["pbr"]
    tried = {key: set(values) for key, (_, values) in readings.one_at_a_time.items()}
    for key, values in readings.pair:
        tried.setdefault(key, set()).update(values)
    for key, value in PBR.PRESETS["paper"].items():
        assert value in tried.get("train.lr" if key == "lr" else key, set()), (key, value)


def test_proxy_budget_refuses_cells_off_the_stream_it_was_validated_on():
    """The proxy was validated on Seq-CIFAR-10-LT, ordered, IR 0.01, 5 tasks (docs/method.md): a
    grid's cell on another stream is refused, not queued and reported as "(proxy)"."""
    from pbr.methods import METHODS

    with pytest.raises(UserError) as e:
        _plan("table3", budget="proxy")
    assert str(e.value) == (
        "--budget proxy was validated on Seq-CIFAR-10-LT only (ordered, IR 0.01, 5 tasks; docs/method.md); 8 of the "
        "8 cells of table3 are off it (data.dataset=cifar100; data.setting=shuffled; data.imbalance_ratio=0.02,0.05,"
        "0.1; e.g. c100-derpp-b200-shu-ir0.01-s0-proxy): use --budget full")
    n = len(METHODS)
    with pytest.raises(UserError, match=rf" {n} of the {2 * n} cells of families are off it \(data.imbalance_ratio=1.0; "
                                        r".*: use --budget full, or keep the validated ones: --only "
                                        r"data.imbalance_ratio=0.01$"):
        _plan("families", budget="proxy")
    with pytest.raises(UserError, match=r"\(data.imbalance_ratio=1.0; data.dataset=cifar100,tinyimagenet; "
                                        r"data.n_tasks=10; .*--only data.dataset=cifar10 --only data.imbalance_ratio=0.01$"):
        _plan("table2", budget="proxy")
    # The --only the error names keeps exactly the validated cells: table 2's CIFAR-10 less its IR 1 bounds.
    kept = _plan("table2", budget="proxy", only={"data.dataset": ["cifar10"], "data.imbalance_ratio": [0.01]})
    bounds = sum(c.role == "bound" for c in METHODS.values())
    assert len(kept) == _table2_rows_per_dataset() - bounds
    assert {(o["data.dataset"], o["data.setting"], o["data.imbalance_ratio"], o["data.n_tasks"])
            for o in (r.overrides for r in kept)} == {("cifar10", "ordered", 0.01, 5)}
    assert len(_plan("table5", budget="proxy")) == 8
    # A stream key given with -S is the user's own departure (docs/method.md's shuffled proxy runs); so
    # is -S train.epochs, which replaces the proxy's per-task epochs.
    assert len(_plan("fidelity", extra={"data.setting": "shuffled"}, only={"row": ["pbr"]}, budget="proxy")) == 1
    assert len(_plan("table3", extra={"train.epochs": 2}, budget="proxy")) == 8
    with pytest.raises(UserError, match="--budget huge: not one of full | proxy"):
        _plan("table5", budget="huge")


def test_proxy_settings_reach_params_yaml_as_dvc_writes_them(tmp_path):
    """`dvc exp run -S` applies a run's settings with DVC's own override writer: the per-task
    epochs list must land in params.yaml as a list the config reads back."""
    from dvc.utils.hydra import apply_overrides

    from stages.runtime.config import load_config

    run = next(r for r in _plan("fidelity", budget="proxy", only={"row": ["er-lr0.03"]}))
    (tmp_path / "params.yaml").write_text(PARAMS.read_text())
    apply_overrides(str(tmp_path / "params.yaml"), run.set_params())
    cfg = load_config(tmp_path / "params.yaml")
    assert cfg.train.epochs == (4, 8, 16, 40, 80) and cfg.model.width == 8
    assert (cfg.method.name, cfg.train.lr, cfg.method.reservoir) == ("er", 0.03, "first_epoch")


def test_expected_cost_of_a_run_by_hand():
    from stages.runtime.config import from_dict

    # Seq-CIFAR-10-LT at IR 0.01 keeps floor(5000 * 0.01^(c/9)) images of class c:
    # 5000 + 2997 + 1796 + 1077 + 645 + 387 + 232 + 139 + 83 + 50 = 12,406 a pass.
    er = from_dict({"method": {"name": "er"}})
    assert sweep.expected_cost(er) == 12406 * 50 * 2  # 50 epochs; a replay batch beside each batch
    assert sweep.expected_cost(from_dict({"method": {"name": "sgd"}, "model": {"width": 32}})) == 12406 * 50 / 4
    per_task = from_dict({"method": {"name": "sgd"}, "train": {"epochs": [1, 1, 1, 1, 2]}})
    assert sweep.expected_cost(per_task) == 12406 + 50 + 83  # task 4 (classes 8, 9) twice
    tiny = from_dict({"data": {"dataset": "tinyimagenet", "n_tasks": 10}, "method": {"name": "sgd"}})
    cifar100 = from_dict({"data": {"dataset": "cifar100", "n_tasks": 10}, "method": {"name": "sgd"}})
    assert sweep.expected_cost(tiny) > 4 * sweep.expected_cost(cifar100)  # 4x the pixels, twice the classes


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_shards_split_the_plan_into_parts_of_balanced_cost(n):
    runs = _plan("table2", seeds=2)
    parts = [sweep.shard(runs, k, n) for k in range(1, n + 1)]
    names = [r.name for p in parts for r in p]
    assert sorted(names) == sorted(r.name for r in runs)  # each run in exactly one shard
    assert all(p == sweep.shard(runs, k, n) for k, p in enumerate(parts, 1))  # deterministic
    # Dealing costliest first to the least loaded: no shard exceeds the mean by more than one run.
    costs = [sum(r.cost for r in p) for p in parts]
    assert max(costs) <= sum(costs) / n + max(r.cost for r in runs)
    # TinyImageNet's costly runs are spread over the machines, not dealt to one of them.
    assert all(any(r.overrides["data.dataset"] == "tinyimagenet" for r in p) for p in parts)


@pytest.mark.parametrize("text", ["0/3", "4/3", "a/b", "2", "1/0"])
def test_a_bad_shard_is_a_one_line_error(text):
    with pytest.raises(UserError, match=rf"--shard {text}: write it as K/N"):
        sweep.parse_shard(text)


def test_jobs_auto_fills_one_gpu_or_the_cores(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    rows = {"row": ["pbr", "er-lr0.1"]}
    runs = _plan("fidelity", seeds=2, only=rows, budget="proxy")
    # train.device auto means cuda on a GPU machine; cuda is a GPU sweep even where none is seen yet.
    assert sweep.on_gpu(runs, PARAMS, cuda_devices=1) and not sweep.on_gpu(runs, PARAMS, cuda_devices=0)
    assert sweep.on_gpu(_plan("fidelity", 2, {"train.device": "cuda"}, rows, "proxy"), PARAMS, cuda_devices=0)
    # A sweep pinned to the CPU stays a CPU sweep on a GPU machine.
    pinned = _plan("fidelity", 2, {"train.device": "cpu"}, rows, "proxy")
    assert not sweep.on_gpu(pinned, PARAMS, cuda_devices=1)
    # A GPU: four at once without MPS, eight with it, whatever the cores.
    assert sweep.auto_jobs(runs, PARAMS, gpu=True, cores=16)[0] == 4
    assert sweep.auto_jobs(runs, PARAMS, gpu=True, mps=True, cores=2)[0] == 8
    # A CPU: one run per core with threads auto (each then takes one), fewer when a run takes more.
    assert sweep.auto_jobs(runs, PARAMS, gpu=False, cores=16)[0] == 16
    assert sweep.auto_jobs(_plan("fidelity", 2, {"train.threads": 3}, rows, "proxy"), PARAMS, False, cores=16)[0] == 5
    assert sweep.auto_jobs(_plan("fidelity", 2, {"train.threads": 4}, rows, "proxy"), PARAMS, False, cores=2)[0] == 1
    # Threads auto with OMP_NUM_THREADS set: every run takes that many (threads.resolve), so 16 cores hold 4.
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    assert sweep.auto_jobs(runs, PARAMS, gpu=False, cores=16)[0] == 4


def test_a_shard_with_no_run_does_nothing(tmp_path, pbr_main):
    """A SLURM array larger than the grid: table1 has 2 runs a seed, so shard 3 of 3 has none."""
    import shutil

    shutil.copy(PARAMS, tmp_path / "params.yaml")
    r = pbr_main("sweep", "table1", "--seeds", "1", "--shard", "3/3", "--jobs", "auto", cwd=tmp_path)
    assert r.returncode == 0 and r.stderr.strip() == "shard 3/3: 0 of 2 runs, 0% of the grid's expected cost", r.stderr


def test_a_sweeps_seed_is_set_by_seeds_not_by_s():
    with pytest.raises(UserError, match=r"^-S seed=7: a sweep gives each run its seed; use --seeds"):
        _plan("table1", 2, {"seed": 7})


@pytest.mark.parametrize("text", ["-1", "many", "2.5", ""])
def test_a_bad_jobs_is_a_one_line_error(text):
    with pytest.raises(UserError, match=rf"--jobs {text}: give a number of runs at once \(0 or more\) or auto"):
        sweep.parse_jobs(text)
    assert sweep.parse_jobs("AUTO") == "auto" and sweep.parse_jobs("3") == 3


def test_offline_runs_go_seed_by_seed():
    """A sweep cut short leaves every row with the same seeds: both rows of seed 3 run before seed 4."""
    from stages.experiments.offline import _order

    runs = _plan("fidelity", seeds=5, only={"row": ["pbr", "er-lr0.1"]})
    order = [r.overrides["seed"] for r in _order(runs)]
    assert order == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]


def test_the_grids_read_who_takes_part_off_the_registry(monkeypatch):
    """No grid names a method: Table 3 runs whoever declares grids=("table3",) against the method of
    role "ours" with its named ablations where the paper has them; a subclass does not inherit its
    parent's place in a grid (PRS and CBRS are ER's subclasses, ER is the fidelity comparator)."""
    from pbr.methods import METHODS
    from pbr.methods.der import DERpp

    class Shuffled(DERpp):
        name = "shuffled_only"
        grids = ("table3", "fidelity")

    class Child(Shuffled):
        name = "child"

    monkeypatch.setitem(METHODS, "shuffled_only", Shuffled)
    monkeypatch.setitem(METHODS, "child", Child)
    table3 = {cell["method.name"] for cell in sweep.table3({})}
    assert table3 == {"derpp", "shuffled_only", "pbr"}
    rows = [cell["_row"] for cell in sweep.fidelity({}) if not cell["_row"].startswith("pbr")]
    assert rows == ["er-lr0.03", "er-lr0.1", "shuffled_only-lr0.03", "shuffled_only-lr0.1"]
    # Ours and each of its ablations, at both buffers on every dataset of Table 2.
    ours = [c for c in sweep.table2({}) if c["method.name"] == "pbr"]
    assert len(ours) == 3 * 2 * (1 + len(METHODS["pbr"].ablations)) == 18
    assert {c.get("method.pbr.sampling") for c in ours} == {None, "reservoir"}


def test_a_sweep_refuses_params_edited_since_the_commit(tmp_path, pbr_main):
    """A quick `dvc exp run -S train.epochs=1 -S model.width=4` leaves its values in params.yaml: a
    sweep then queued the grid's runs under their usual names at width 4, one epoch, and the full
    sweep after `git checkout params.yaml` skipped every one of them as finished."""
    import subprocess

    import yaml

    (tmp_path / "params.yaml").write_text(PARAMS.read_text())
    for cmd in (["init", "-q"], ["add", "params.yaml"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                                                          "-m", "x"]):
        subprocess.run(["git", *cmd], cwd=tmp_path, check=True)
    params = yaml.safe_load(PARAMS.read_text())
    params["model"]["width"], params["train"]["epochs"] = 4, 1
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    r = pbr_main("sweep", "table5", "--seeds", "1", "--offline", str(tmp_path / "o"), cwd=tmp_path)
    assert r.returncode == 2 and "params.yaml differs from the commit in model.width, train.epochs" in r.stderr
    assert "git checkout params.yaml" in r.stderr and not (tmp_path / "o").exists()
    # --dry-run plans, and says what the real call would refuse (it listed the runs as if all were well)
    r = pbr_main("sweep", "table5", "--seeds", "1", "--dry-run", cwd=tmp_path)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 8
    assert "warning: the sweep itself would stop here: params.yaml differs from the commit in model.width" in r.stderr
    # where the data lies on this machine is no setting of a run: the sweep goes on
    params = yaml.safe_load(PARAMS.read_text())
    params["data"].update(root="/elsewhere/raw", download=False)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    from stages.experiments.sweep import refuse_edited_params

    refuse_edited_params(tmp_path / "params.yaml")


def test_a_queued_sweep_checks_its_data_before_queueing(tmp_path, pbr_main):
    """The queue prepares each run's data in its own workspace: a data set missing at data.root (no
    download) failed every queued run, one by one."""
    import yaml

    params = yaml.safe_load(PARAMS.read_text())
    params["data"].update(root=str(tmp_path / "nothing"), download=False)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    r = pbr_main("sweep", "table3", "--seeds", "1", cwd=tmp_path)
    assert r.returncode == 2 and f"data.root = {tmp_path / 'nothing'}: no cifar100 data there" in r.stderr, r.stderr
    assert not (tmp_path / ".dvc").exists()


@pytest.mark.parametrize("grid,extra,msg", [
    # table5 names its runs by head: all eight would run cosine, four pairs of one run under two names.
    ("table5", {"model.head": "cosine"}, r"^-S model.head: table5 sets it run by run \(cosine, linear.*--only model.head=VALUE"),
    # table2's b200 and b500 runs would both run buffer 1000, named b200 and b500.
    ("table2", {"method.buffer_size": 1000}, r"^-S method.buffer_size: table2 sets it run by run \(200, 500"),
    # fid-pbr would be fid-pbr-literal.
    ("fidelity", {"method.pbr.preset": "paper"}, r"^-S method.pbr.preset: fidelity sets it run by run \(paper; other "
                                                 r"runs as params.yaml has it\)"),
])
def test_s_on_a_key_the_grid_sets_run_by_run_is_refused(grid, extra, msg):
    with pytest.raises(UserError, match=msg):
        _plan(grid, extra=extra)
    # A key every run of the grid has alike (fidelity's dataset) or none sets stays -S's, and so does one
    # the runs --only picks have alike (the GPU benchmark's rows and tau1).
    assert len(_plan("fidelity", extra={"data.imbalance_ratio": 0.1, "train.epochs": 1})) == len(_plan("fidelity"))
    assert len(_plan("fidelity", extra={"method.pbr.tau1": 0.5}, only={"row": ["pbr", "er-lr0.1"]})) == 2


def test_only_picks_seeds_never_and_a_repeated_key_adds_values():
    with pytest.raises(UserError, match=r"^--only seed=1: a sweep's seeds are --seeds"):
        _plan("table1", 3, only=sweep.parse_assignments(["seed=1"], "--only", many=True))
    twice = sweep.parse_assignments(["method.name=pbr", "method.name=sgd", "data.setting=ordered"], "--only", many=True)
    assert twice == {"method.name": ["pbr", "sgd"], "data.setting": ["ordered"]}
    assert {r.overrides["method.name"] for r in _plan("table5", only=twice)} == {"pbr", "sgd"}


def test_a_params_file_without_a_key_the_sweep_reads_names_the_file(tmp_path):
    import yaml

    cut = yaml.safe_load(PARAMS.read_text())
    del cut["train"]["device"]
    f = tmp_path / "mine.yaml"
    f.write_text(yaml.safe_dump(cut))
    runs = _plan("fidelity", only={"row": ["pbr"]})
    with pytest.raises(UserError, match=rf"^{re.escape(str(f))}: no train.device in it; copy it from the project's params.yaml"):
        sweep.on_gpu(runs, f)


def test_a_queued_sweep_of_another_params_file_is_refused(tmp_path, pbr_main):
    """`dvc exp run -S` sets the repository's params.yaml: the plan of another file would not be what ran."""
    (tmp_path / "params.yaml").write_text(PARAMS.read_text())
    (tmp_path / "mine.yaml").write_text(PARAMS.read_text().replace("width: 64", "width: 4"))
    r = pbr_main("sweep", "table1", "--seeds", "1", "--params", "mine.yaml", "--dry-run", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip().startswith(
        "error: --params mine.yaml: queued DVC runs take the repository's params.yaml; sweep mine.yaml with --offline DIR")
    r = pbr_main("sweep", "table1", "--seeds", "1", "--params", "params.yaml", "--dry-run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("text,msg", [
    ("4294967296", "at most 10000 seeds a cell, each below 2**32"),  # was a MemoryError building range(2**32)
    ("0-4294967295", "at most 10000 seeds a cell"),
    ("4294967296-4294967296", "each below 2**32"),  # params.yaml refuses such a seed; said before planning
    ("3-1", "a range A-B with A <= B"),
    ("1,1", "a list A,B,C of distinct seeds"),
    ("2,x", "give N (seeds 0..N-1, N >= 1)"),
])
def test_bad_seeds_are_one_line_errors(text, msg):
    with pytest.raises(UserError, match=f"^--seeds {text}: .*" + re.escape(msg)):
        sweep.parse_seeds(text)
    assert sweep.parse_seeds("0,4294967295") == [0, 4294967295] and len(sweep.parse_seeds("10000")) == 10000


def test_seeds_read_as_a_count_a_range_with_both_ends_or_a_list():
    assert sweep.parse_seeds("3") == [0, 1, 2]
    assert sweep.parse_seeds("100-109") == list(range(100, 110))  # a confirmation's ten seeds
    assert sweep.parse_seeds("5-5") == [5] and sweep.parse_seeds("7,3") == [7, 3]


def test_shards_deal_the_costliest_runs_first():
    """Costs 1, 1, 1, 1, 4 on two machines: 4 and 1+1+1+1 finish together. Dealt in cost order
    from the cheapest, the 4 came last onto a shard already holding 2: 6 against 2."""
    runs = [sweep.Run(f"r{i}", {}, c) for i, c in enumerate((1.0, 1.0, 1.0, 1.0, 4.0))]
    loads = sorted(sum(r.cost for r in sweep.shard(runs, k, 2)) for k in (1, 2))
    assert loads == [4.0, 4.0]


def test_a_set_value_wins_over_the_budget_and_over_a_key_every_cell_has_alike():
    """plan(): `extra` (-S) wins over the grid and the budget: -S train.epochs=2 at --budget proxy
    trains 2 epochs, and -S data.imbalance_ratio=0.1 on fidelity (every cell at 0.01) runs at 0.1."""
    (run,) = _plan("fidelity", extra={"train.epochs": 2, "data.imbalance_ratio": 0.1}, only={"row": ["pbr"]},
                   budget="proxy")
    assert run.overrides["train.epochs"] == 2 and run.overrides["data.imbalance_ratio"] == 0.1
    assert run.overrides["model.width"] == 8  # the budget's other keys stay


def test_a_bound_the_families_grid_runs_is_table2s_run():
    """SGD and JOINT have no buffer: the families grid's are table 2's runs on CIFAR-10 (at IR 0.01
    and 1), one experiment each, not a second training named for a buffer they do not have."""
    fam = {r.name for r in _plan("families")}
    t2 = {r.name for r in _plan("table2", only={"data.dataset": "cifar10"})}
    assert {"c10-sgd-ord-ir0.01-s0", "c10-sgd-ord-ir1-s0", "c10-joint-ord-ir0.01-s0", "c10-joint-ord-ir1-s0"} <= fam & t2
