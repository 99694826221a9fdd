"""`pbr report`: the paper's tables from the finished runs in MLflow.

One table per (data.setting, data.imbalance_ratio): methods in rows (with the buffer size as the
first column), each dataset's Class-IL and Task-IL in columns, every cell "mean ± std (n=seeds)"
over seeds, with the paper's number beside it where the paper has one. Printed as markdown,
written as CSV (one row per table row and dataset) and optionally as a markdown file.

Only runs with status FINISHED and the tag pbr.complete = "true" count. Runs of one group with the
same seed and the same settings are repeats: the newest one is used. Runs of one group that differ
in a setting other than the seed are averaged together, and a note under the table says so.
Where a run trained (its device kind, cpu or cuda, and its precision, fp32 or bf16) is part of a
row's identity: runs of one cell made on two machines are separate rows, never averaged or paired.
Under each table, PBR at its defaults is set against every other row of its machine on the seeds
both ran (the mean paired difference, its Student's t 95% interval, n): seeds share the data order
and the initialisation, so the pairs are far less noisy than the two means. mlflow is imported
only when the store is read. How to read it: docs/report.md.
"""

from __future__ import annotations

import ast
import csv
import functools
import io
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from pbr.data.facts import DATASETS as FACTS
from pbr.errors import UserError
from stages.runtime import artifacts

METRICS = ("acc", "bwt", "forgetting")
MODES = ("class_il", "task_il")  # the prefixes of the metrics the tables read
DEFAULT_EXPERIMENT = "pbr"
DEFAULT_CSV = Path("reports/report.csv")
COMPLETE_TAG = "pbr.complete"
PAPER_LR = 0.03  # the one learning rate the paper states for every method

DATASETS = {k: d.title for k, d in FACTS.items()}


def _method(name: str):
    """The registered method class of `name`, or None (a run of a method no longer registered)."""
    from pbr.methods import METHODS

    return METHODS.get(name)


def spelled(cls, key: str) -> str:
    """The params key of a method setting: method.<method>.<key>, or method.<key> when shared."""
    shared = any(s.key == key and s.shared for s in cls.settings)
    return f"method.{key}" if shared else f"method.{cls.name}.{key}"


def own_settings(params: dict[str, str]) -> dict[str, str]:
    """The run's method settings by their bare keys (tau1, reservoir)."""
    cls = _method(params.get("method.name", ""))
    if cls is None:
        return {}
    return {s.key: params[spelled(cls, s.key)] for s in cls.settings if spelled(cls, s.key) in params}


def respell(params: dict[str, str]) -> dict[str, str]:
    """A run recorded before each method's keys moved under its name (method.tau1, and every other
    method's keys beside them) read in today's spelling (method.pbr.tau1; the keys its method does
    not declare dropped, as today's runs do not record them)."""
    from pbr.methods import METHODS

    cls = _method(params.get("method.name", ""))
    if cls is None:
        return params
    own = {s.key for s in cls.settings if not s.shared}
    shared = {s.key for m in METHODS.values() for s in m.settings if s.shared}
    out = {}
    for k, v in params.items():
        bare = k.removeprefix("method.")
        if k != bare and bare in own:
            out.setdefault(f"method.{cls.name}.{bare}", v)
        elif k == bare or "." in bare or bare in ("name", "buffer_size") or bare in shared:
            out[k] = v
        # else another method's key: it never changed this run
    return out


def _reads(params: dict[str, str], key: str) -> bool:
    """Whether the run's method reads `key` (a method setting's params key) under the run's settings."""
    cls = _method(params.get("method.name", ""))
    return cls is not None and cls.reads(key.rsplit(".", 1)[-1], own_settings(params))


SETTINGS = ("ordered", "shuffled")
# Params that do not change a run's results: runs differing only in these are not flagged.
# Not train.eval_batch_size: PBR's walk draws its MC-dropout masks a batch at a time, so its buffer
# (and accuracy) depends on it.
IGNORED_PARAMS = frozenset({"seed", "data.root", "data.download", "data.shard_mb", "train.device"})
CSV_COLUMNS = ("budget", "setting", "imbalance_ratio", "dataset", "method", "buffer_size", "n_runs",
               "class_il_mean", "class_il_std", "task_il_mean", "task_il_std",
               "paper_class_il", "paper_task_il", "metric", "n_tasks", "paper_n_tasks", "device", "precision",
               "n_seeds", "class_il_n", "task_il_n", "seeds")


def _default_uri() -> str:
    from stages.runtime.tracking import tracking_uri

    return tracking_uri()


def paper_numbers(setting: str, ir: float, dataset: str, label: str, buf: int | None) -> tuple[float | None, float | None]:
    """The paper's (Class-IL, Task-IL) of a row, or Nones."""
    from stages.experiments.paper_results import PAPER_RESULTS

    at_paper_lr = f" (lr {PAPER_LR:g})"
    if (setting, ir, dataset, label, buf) not in PAPER_RESULTS and label.endswith(at_paper_lr):
        # "ER (lr 0.03)" is ER as the paper ran it (every method at 0.03): its number too.
        label = label.removesuffix(at_paper_lr)
    return PAPER_RESULTS.get((setting, ir, dataset, label, buf), (None, None))


@dataclass(frozen=True)
class RunRecord:
    """What the report needs of one MLflow run."""

    run_id: str
    params: dict[str, str]
    metrics: dict[str, float]
    start_time: int = 0
    tags: dict[str, str] = field(default_factory=dict)


UNKNOWN = "unknown"


def device_of(r: RunRecord) -> str:
    """The device kind the run trained on: the train stage's pbr.device tag ("cuda:0" -> "cuda"),
    else train.device where it names one; "unknown" for a train.device auto run without the tag."""
    d = r.tags.get("pbr.device") or r.params.get("train.device", "auto")
    return UNKNOWN if d in ("", "auto") else d.split(":")[0]


def precision_of(params: dict[str, str]) -> str:
    """fp32 or bf16 as the run resolved it (pin_auto has put its resolved.precision in place of
    auto); a run from before train.precision existed ran in fp32; auto with no record: unknown."""
    p = params.get("train.precision", "fp32")
    return UNKNOWN if p in ("", "auto") else p


def machine_text(device: str, precision: str) -> str:
    return f"{'device unknown' if device == UNKNOWN else device}, " \
           f"{'precision unknown' if precision == UNKNOWN else precision}"


def _finite(r: RunRecord, key: str) -> float | None:
    v = r.metrics.get(key)
    return v if v is not None and math.isfinite(v) else None


@dataclass
class Group:
    """The runs of one cell group: (setting, IR, dataset, n_tasks, method label, buffer)."""

    setting: str
    imbalance_ratio: float
    dataset: str
    n_tasks: int | None
    method: str
    buffer_size: int | None
    budget: str = "full protocol"
    device: str = UNKNOWN
    precision: str = "fp32"
    runs: list[RunRecord] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # Set where the group's table holds runs of more than one machine: the label then says which.
    show_machine: bool = False

    @property
    def machine(self) -> str:
        return machine_text(self.device, self.precision)

    @property
    def label(self) -> str:
        """The row label: the method, and where its table mixes machines, where it ran."""
        return f"{self.method} [{self.machine}]" if self.show_machine else self.method

    def values(self, mode: str, metric: str) -> list[float]:
        cls = _method(self.runs[0].params.get("method.name", "")) if self.runs else None
        if mode == "class_il" and cls is not None and not cls.class_il:
            return []  # no Class-IL prediction (PNN): "-" as in the paper
        if metric in ("bwt", "forgetting") and cls is not None and not cls.learns_each_task:
            return []  # JOINT's earlier rows are an untrained network's (runs evaluated before it said so too)
        return [v for r in self.runs if (v := _finite(r, f"{mode}.{metric}")) is not None]

    def by_seed(self, mode: str, metric: str) -> dict[str, float]:
        """`mode.metric` by seed: the mean of a seed's runs where runs of differing settings share
        the group (a note says so). The cell, the paired lines and the figure all read these, so a
        seed with two runs counts once everywhere."""
        key = f"{mode}.{metric}"
        if not self.values(mode, metric):
            return {}
        seeds: dict[str, list[float]] = {}
        for r in self.runs:
            if (v := _finite(r, key)) is not None:
                seeds.setdefault(r.params.get("seed", ""), []).append(v)
        return {s: statistics.fmean(v) for s, v in seeds.items()}

    def stats(self, mode: str, metric: str) -> tuple[float, float, int] | None:
        """(mean, sample std (0 for one seed), n seeds) of `mode.metric` over the seeds' values, None
        when no run has it."""
        v = list(self.by_seed(mode, metric).values())
        if not v:
            return None
        return statistics.fmean(v), (statistics.stdev(v) if len(v) > 1 else 0.0), len(v)

    def paper(self) -> tuple[float | None, float | None]:
        return paper_numbers(self.setting, self.imbalance_ratio, self.dataset, self.method, self.buffer_size)

    def paper_n_tasks(self) -> int | None:
        from stages.experiments.paper_results import PAPER_N_TASKS

        return PAPER_N_TASKS.get((self.setting, self.dataset))

    def describe(self) -> str:
        buf = "" if self.buffer_size is None else f", buffer {self.buffer_size}"
        return f"{self.label}{buf}, {_dataset_header(self.dataset, self.n_tasks)}"


@dataclass
class Report:
    text: str                    # the markdown (or the "no runs" message) to print
    groups: list[Group]
    csv_path: Path | None = None
    markdown_path: Path | None = None
    figures: list[Path] = field(default_factory=list)  # one PNG per table
    mlflow_run: str | None = None  # the run of REPORT_EXPERIMENT holding this report's files
    warnings: list[str] = field(default_factory=list)  # one line each, for stderr


# --------------------------------------------------------------------------- labels

# How a method setting that differs from its default reads in a row label, first to last (other
# keys read "key value"); the online reservoir's rule is the budget's, not the row's.



@functools.lru_cache(maxsize=None)
def _schema_defaults(method: str | None = None) -> dict[str, str]:
    """params.yaml's schema defaults for a run of `method` (its own section, the shared keys)."""
    from stages.runtime.config import Config, MethodConfig

    cfg = Config() if method is None else Config(method=MethodConfig(name=method))
    return {k: str(v) for k, v in cfg.flat().items()}


def _schema_default(key: str) -> str:
    return _schema_defaults()[key]


def resolved(params: dict[str, str]) -> dict[str, str]:
    """The params with "auto" values (lr and the method's own keys) replaced by the method's
    values for the run's dataset and buffer, so a run that spells out a default reads the same as
    one that leaves it auto."""
    cls = _method(params.get("method.name", ""))
    if cls is None:
        return params
    out = dict(params)
    dataset, buffer = params.get("data.dataset", "cifar10"), int(params.get("method.buffer_size", "0") or 0)
    # The method resolves its own "auto"s (a preset included), as it did when the run trained.
    # A run that recorded the method's settings but not this one ran before it existed, with what the
    # code did then (a partial dict, e.g. a sweep's overrides, reads as today's defaults).
    recorded = any(spelled(cls, s.key) in params for s in cls.settings)
    given = {s.key: params.get(spelled(cls, s.key), s.before if recorded and s.before is not None else s.default)
             for s in cls.settings}
    opts, _ = cls.options(dataset, buffer, lr=params.get("train.lr", "auto"),
                          lr_milestones=_milestones(params.get("train.lr_milestones", "auto")), **given)
    out["train.lr"] = _canonical(opts.lr)
    out["train.lr_milestones"] = _canonical_milestones(opts.lr_milestones)
    for k in cls.setting_keys():
        out[spelled(cls, k)] = _canonical(getattr(opts, k))
    return out


def _canonical(v) -> str:
    """A param as text, numbers as floats ("0.1" and "0.10" and 0.1 are one value)."""
    if isinstance(v, bool) or v in ("True", "False"):
        return str(v)
    try:
        return str(float(v))
    except (TypeError, ValueError):
        return str(v)


def _milestones(v: Any) -> Any:
    """train.lr_milestones as MLflow keeps it ("[0.7, 0.9]", "[]", "auto") as a method takes it."""
    if not isinstance(v, str) or v == "auto":
        return v
    try:
        got = ast.literal_eval(v)
        return tuple(float(f) for f in got)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return v  # a hand-logged value that is no list: read as it is, on a row of its own


def _canonical_milestones(v: Any) -> str:
    """Milestones as text, numbers as floats ("[0.7, 0.9]"; "[]": a constant lr)."""
    return str([float(f) for f in v]) if isinstance(v, (list, tuple)) else str(v)


def _milestones_label(v: str) -> str:
    """How lr milestones other than the method's own read in a row label."""
    return "constant lr" if v == "[]" else f"lr milestones {v.strip('[]').replace(', ', '/')}"


def method_label(params: dict[str, str]) -> str:
    """The row label as the paper writes it: SGD, JOINT, ER, DER, DER++, PBR, plus the variants the
    method names for its settings, e.g. "PBR (random)", "PBR (paper-literal)", then a head other
    than the method's own ("PBR (linear)") and a learning rate other than its own ("ER (lr 0.03)";
    the paper ran every method at 0.03)."""
    name = params.get("method.name", "")
    cls = _method(name)
    if cls is None:
        return name
    dataset, buffer = params.get("data.dataset", "cifar10"), params.get("method.buffer_size", "0")
    # The method's own values under the run's own preset, so a preset reads as one word.
    own = {**_schema_defaults(name), "method.name": name, "data.dataset": dataset, "method.buffer_size": buffer}
    for s in cls.settings:
        if s.selects_defaults:
            own[spelled(cls, s.key)] = params.get(spelled(cls, s.key), own.get(spelled(cls, s.key)))
    params, defaults = resolved(params), resolved(own)
    for s in cls.settings:
        if s.selects_defaults:
            defaults[spelled(cls, s.key)] = _canonical(s.default)
    variants = cls.variant_labels(own_settings(params), own_settings(defaults))
    head = params.get("model.head", "auto")
    own_head, _ = cls.resolve("head", "auto", dataset, int(buffer or 0))
    if head not in ("auto", own_head):
        variants.append(head)
    if params["train.lr"] != defaults["train.lr"]:
        variants.append(f"lr {float(params['train.lr']):g}")
    if params["train.lr_milestones"] != defaults["train.lr_milestones"]:  # a schedule is the lr's too
        variants.append(_milestones_label(params["train.lr_milestones"]))
    return f"{cls.label} ({', '.join(variants)})" if variants else cls.label


def budget_of(params: dict[str, str]) -> str:
    """"full protocol" (params.yaml's width and epochs), "proxy" (`pbr sweep --budget proxy`), or
    the run's width and epochs (and the online reservoir's rule, for the methods that have one)."""
    from stages.experiments.sweep import BUDGETS

    width, epochs = params.get("model.width", "64"), params.get("train.epochs", "50")
    reservoir = params.get("method.reservoir", "every_epoch")
    if not _reads(resolved(params), "reservoir"):  # resolved: what the run's "auto" settings were
        reservoir = None  # the method has no online reservoir: the setting does not change it
    proxy = BUDGETS["proxy"]
    if (width, epochs) == (str(proxy["model.width"]), str(proxy["train.epochs"])) and \
            reservoir in (None, proxy["method.reservoir"]):
        return "proxy"
    if (width, epochs) == (_schema_default("model.width"), _schema_default("train.epochs")) and \
            reservoir in (None, "every_epoch"):
        return "full protocol"
    extra = "" if reservoir in (None, "every_epoch") else f", reservoir {reservoir}"
    return f"width {width}, epochs {epochs}{extra}"


def buffer_of(params: dict[str, str]) -> int | None:
    """The buffer size of a rehearsal method; None for sgd/joint."""
    cls = _method(params.get("method.name", ""))
    if cls is not None and not cls.uses_buffer:
        return None
    return int(params["method.buffer_size"])


def _fmt_ir(ir: float) -> str:
    return f"{ir:g}"


def _dataset_header(dataset: str, n_tasks: int | None) -> str:
    name = DATASETS.get(dataset, dataset)
    return name if n_tasks is None else f"{name} ({n_tasks} tasks)"


# --------------------------------------------------------------------------- reading MLflow

def pin_auto(params: dict[str, str], tags: dict[str, str]) -> dict[str, str]:
    """The run's "auto" method settings replaced by the values it ran with (its `resolved.*` tags),
    so that a run from before a default changed is not read with today's default."""
    out = dict(params)
    # How many threads an auto run had, where they move its results (a CPU's last digits); on a GPU
    # the count follows how many runs shared the machine, and changes nothing. A run resumed on
    # another count has each task's ("2,2,2,1,1"), whatever its param says now.
    had = tags.get("pbr.threads") or ""
    if (params.get("train.threads") == "auto" or "," in had) and had and tags.get("pbr.device", "cpu") == "cpu":
        out["train.threads"] = had
    for key, value in params.items():
        if value == "auto" and (key.startswith("method.") or key in ("train.lr", "train.lr_milestones", "train.precision",
                                                                     "train.channels_last", "model.head", "model.dropout")):
            ran = tags.get(f"resolved.{key.rsplit('.', 1)[1]}")
            if ran is not None:
                out[key] = ran
    return out


def collect_runs(tracking_uri: str, experiment: str = DEFAULT_EXPERIMENT, flag: bool = False) -> list[RunRecord] | None:
    """Finished, complete runs of `experiment` (the store named by --tracking-uri with `flag`). None
    when there is no store or no such experiment.

    Raises UserError when the store exists but cannot be read."""
    from stages.runtime.tracking import refuse_journal, refuse_unreachable

    refuse_journal(tracking_uri, flag)
    refuse_unreachable(tracking_uri, flag)
    if tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri[len("sqlite:///"):].split("?", 1)[0])
        if not db.is_file():  # do not let MlflowClient create an empty store
            return None
    try:
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=tracking_uri)
        exp = client.get_experiment_by_name(experiment)
        if exp is None:
            return None
        from stages.runtime.config import ADDED_LATER
        from stages.runtime.tracking import close_dead_runs

        close_dead_runs(tracking_uri, exp.experiment_id)
        found, token = [], None
        while True:
            page = client.search_runs(
                [exp.experiment_id],
                filter_string=f"attributes.status = 'FINISHED' and tags.`{COMPLETE_TAG}` = 'true'",
                max_results=1000, page_token=token)
            found.extend(page)
            token = page.token
            if not token:
                break
    except Exception as e:  # a store that cannot be opened fails in many ways
        from stages.runtime.tracking import store_error, store_fix

        raise UserError(store_error(tracking_uri, e, store_fix(flag))) from None
    # The `resolved.*` params (for MLflow's charts) repeat the tags pin_auto reads; as settings they
    # would split every cell by seed (resolved.seed) and set new runs apart from old ones.
    return [RunRecord(r.info.run_id, pin_auto(respell({**ADDED_LATER, **{k: v for k, v in r.data.params.items()
                                                                        if not k.startswith("resolved.")}}),
                                              dict(r.data.tags)), dict(r.data.metrics),
                      r.info.start_time or 0, dict(r.data.tags))
            for r in found
            if r.info.status == "FINISHED" and r.data.tags.get(COMPLETE_TAG) == "true"]


# --------------------------------------------------------------------------- grouping

def _signature(params: dict[str, str]) -> tuple:
    params = resolved(params)
    drop = set(IGNORED_PARAMS)
    name = params.get("method.name", "")
    if buffer_of(params) is None:
        drop.add("method.buffer_size")
    # Another method's settings do not change this one's results.
    drop |= {k for k in params if k.startswith("method.") and k not in ("method.name", "method.buffer_size")
             and _method(name) is not None and not _reads(params, k)}
    return tuple(sorted((k, v) for k, v in params.items() if k not in drop))


def group_runs(runs: Iterable[RunRecord]) -> tuple[list[Group], list[str]]:
    """Cell groups in table order, and notes on runs that were left out."""
    groups: dict[tuple, Group] = {}
    skipped: list[str] = []
    for r in runs:
        p = r.params
        try:
            setting, dataset, _, _ = p["data.setting"], p["data.dataset"], p["method.name"], p["seed"]  # present
            ir = round(float(p["data.imbalance_ratio"]), 6)
            n_tasks = int(p["data.n_tasks"]) if "data.n_tasks" in p else None
            buf = buffer_of(p)
        except (KeyError, ValueError) as e:
            skipped.append(f"run {r.run_id} left out: param {e} missing or not a number")
            continue
        label, budget, device, precision = method_label(p), budget_of(p), device_of(r), precision_of(p)
        key = (budget, setting, ir, dataset, n_tasks, label, buf, device, precision)
        g = groups.setdefault(key, Group(setting, ir, dataset, n_tasks, label, buf, budget, device, precision))
        # A NaN or infinite metric (an imported or hand-logged run: training refuses a non-finite
        # loss) reads as missing (Group.values): one would make its row's means and intervals NaN.
        # Only what the tables read: a scoring's NaN (JOINT has no forgotten samples) is no missing cell.
        bad = sorted(k for k, v in r.metrics.items() if k.split(".")[0] in MODES and not math.isfinite(v))
        if bad:
            g.notes.append(f"{g.describe()}: run {r.run_id}'s {', '.join(bad)} not finite, left out of its cells "
                           "(the run's other figures count)")
        g.runs.append(r)

    for gs in _tables(groups.values()).values():
        if len({(g.device, g.precision) for g in gs}) > 1:
            for g in gs:
                g.show_machine = True

    for g in groups.values():
        # Repeats: same seed and same settings -> the newest run.
        # Each run's settings resolved once (a resolve is a method's options: slow, run after run).
        sig = {id(r): _signature(r.params) for r in g.runs}
        newest: dict[tuple, RunRecord] = {}
        for r in sorted(g.runs, key=lambda r: r.start_time):
            newest[(r.params.get("seed"), sig[id(r)])] = r
        if len(newest) < len(g.runs):
            g.notes.append(f"{g.describe()}: {len(g.runs) - len(newest)} older run(s) repeating a seed "
                           f"with the same settings left out")
        g.runs = sorted(newest.values(), key=lambda r: (r.params.get("seed", ""), r.start_time))
        # Mixed settings: say which params differ.
        keys = set().union(*(dict(sig[id(r)]) for r in g.runs))
        res = [resolved(r.params) for r in g.runs] if len(g.runs) > 1 else []
        differ = []
        for k in sorted(keys):
            vals = sorted({p.get(k, "<unset>") for p in res})
            if len(vals) > 1:
                differ.append(f"{k} ({', '.join(vals[:4])}{', ...' if len(vals) > 4 else ''})")
        if differ:
            g.notes.append(f"{g.describe()}: runs averaged together differ in {'; '.join(differ)}")

    return sorted(groups.values(), key=_group_order), skipped


def _tables(groups: Iterable[Group]) -> dict[tuple, list[Group]]:
    """The groups of each table: (budget, setting, IR) -> groups."""
    tables: dict[tuple, list[Group]] = {}
    for g in groups:
        tables.setdefault((g.budget, g.setting, g.imbalance_ratio), []).append(g)
    return tables


def _machine_rank(device: str, precision: str) -> tuple:
    return (device == UNKNOWN, device, precision == UNKNOWN, precision)


def _setting_rank(s: str) -> tuple:
    return (SETTINGS.index(s) if s in SETTINGS else len(SETTINGS), s)


def _row_order(method: str, buffer: int | None) -> tuple:
    base, _, variant = method.partition(" (")
    from pbr.methods import METHODS

    classes = {cls.label: cls for cls in METHODS.values()}
    names = list(classes)
    rank = names.index(base) if base in names else len(names)
    first = getattr(classes.get(base), "row_order", ()) or ("",)  # the method's own order of its variants
    variant = variant.removesuffix(")")
    vrank = first.index(variant) if variant in first else len(first)
    return (buffer is not None, buffer or 0, rank, base, vrank, variant)


def _col_order(dataset: str, n_tasks: int | None) -> tuple:
    names = list(DATASETS)
    return (names.index(dataset) if dataset in names else len(names), dataset, n_tasks or 0)


def _budget_rank(b: str) -> tuple:
    return ({"full protocol": 0, "proxy": 1}.get(b, 2), b)


def _group_order(g: Group) -> tuple:
    return (_budget_rank(g.budget), _setting_rank(g.setting), g.imbalance_ratio, _row_order(g.method, g.buffer_size),
            _machine_rank(g.device, g.precision), _col_order(g.dataset, g.n_tasks))


# --------------------------------------------------------------------------- output

def _cell(g: Group | None, mode: str, metric: str, paper: float | None, paper_tasks: int | None,
          n_tasks: int | None) -> str:
    s = g.stats(mode, metric) if g is not None else None
    # One seed has no spread (the CSV leaves its std empty): "± 0.00" would read as a measured one.
    text = "-" if s is None else f"{s[0]:.2f} ± {s[1]:.2f} (n={s[2]})" if s[2] > 1 else f"{s[0]:.2f} (n=1)"
    if paper is not None:
        other = paper_tasks is not None and n_tasks is not None and paper_tasks != n_tasks
        text += f" [paper {paper:.2f}{f', {paper_tasks} tasks' if other else ''}]"
    return text


def seed_text(seeds: Iterable[int | str]) -> str:
    """Seeds as runs of consecutive ones: 0-9, 100-109, 205."""
    nums = sorted({int(s) for s in seeds})
    spans: list[list[int]] = []
    for n in nums:
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)


def _pooled_confirmation_notes(groups: list[Group]) -> list[str]:
    """A pre-registered confirmation's seeds were never used for a choice; averaged with seeds that
    may have been (the selection seeds a setting was picked on: any seed of no confirmation), the
    row reads better than the plan's alone. One note a cell; two confirmations' fresh seeds pooled
    are no such mix."""
    from stages.experiments.confirmation import reserved_blocks

    fresh = {s for block in reserved_blocks() for s in block}  # the next confirmation's block too
    blocks = sorted(block for block, plans in reserved_blocks().items() if plans)
    notes = []
    for g in groups:
        seeds = {s for r in g.runs if (s := r.params.get("seed", "")).isdigit()}
        held = [f"{b[0]}-{b[-1]}" for b in blocks if seeds & set(b)]
        if held and seeds - fresh:
            whose, alone = (("a pre-registered confirmation's", "those") if len(held) == 1 else
                            ("pre-registered confirmations'", "each"))
            notes.append(f"{g.describe()}: seeds {seed_text(seeds - fresh)} averaged with "
                         f"{whose} {' and '.join(held)} (docs/preregistration.md); {alone} alone: "
                         + " or ".join(f"`pbr report --seeds {h}`" for h in held))
    return notes


def _reserved_seed_notes(groups: list[Group]) -> list[str]:
    """A row on seeds kept for a confirmation that is none of that confirmation's rows (another
    reading, budget or machine on them, or any row on the next block): a choice made by it would
    spend the seeds. One note a row."""
    from stages.experiments.confirmation import in_cell, reserved_blocks

    notes = []
    for g in groups:
        seeds = {s for r in g.runs if (s := r.params.get("seed", "")).isdigit()}
        on = sorted({s for block, plans in reserved_blocks().items() if not any(in_cell(g, p) for p in plans)
                     for s in seeds & set(block)}, key=int)
        if on:
            notes.append(f"{g.describe()}: computed on seeds {seed_text(on)}, kept for pre-registered confirmations "
                         "(docs/preregistration.md) and not one of their rows: a choice made by it spends those seeds")
    return notes


def render_markdown(groups: list[Group], metric: str = "acc", skipped: Iterable[str] = (),
                    seeds: Iterable[int] | None = None) -> str:
    """One markdown table per (setting, IR); notes under each table. `seeds`: the runs were those
    of these seeds only (`--seeds`), which the title says."""
    from stages.experiments.paper_results import PAPER_N_TASKS

    what = {"acc": "final average accuracy", "bwt": "backward transfer",
            "forgetting": "forgetting"}[metric]
    only = "" if seeds is None else f"; seeds {seed_text(seeds)} only"
    out = [f"# {metric.upper()} (%, {what}): mean ± std over seeds (n = seeds, no ± for one; a seed counts once: its newest "
           f"run, or the mean of its runs of differing settings{only})"]
    if metric == "acc" and any(paper_numbers(setting, ir, g.dataset, g.method, g.buffer_size) != (None, None)
                               for (budget, setting, ir), gs in sorted_tables(groups) if budget == "full protocol"
                               for g in gs):  # the paper's numbers sit beside the full protocol's rows only
        out.append("[paper X] is the published number (mean of 5 runs); "
                   "[paper X, N tasks] where the paper used another number of tasks.")
    if metric == "forgetting":  # not Mammoth's: a reader setting the two side by side reads ours lower
        out.append("Forgetting is the mean over the tasks but the last of the best accuracy before the final task "
                   "minus the final one (Chaudhry et al. 2018; it can be negative). Mammoth's takes the best over "
                   "every evaluation, the final one included, so its values are never below 0 and never below ours. "
                   "Lower is better.")
    for (budget, setting, ir), gs in sorted_tables(groups):
        cols = sorted({(g.dataset, g.n_tasks) for g in gs}, key=lambda c: _col_order(*c))
        rows = sorted({(g.method, g.buffer_size, g.device, g.precision, g.label) for g in gs},
                      key=lambda r: (_row_order(r[0], r[1]), _machine_rank(r[2], r[3])))
        by_key = {(g.method, g.buffer_size, g.device, g.precision, g.dataset, g.n_tasks): g for g in gs}
        header = ["Buffer", "Method"]
        for d, n in cols:
            header += [f"{_dataset_header(d, n)} Class-IL", f"{_dataset_header(d, n)} Task-IL"]
        machines = sorted({(g.device, g.precision) for g in gs}, key=lambda m: _machine_rank(*m))
        where = (f"Ran on {machine_text(*machines[0])}." if len(machines) == 1 else
                 f"Ran on {len(machines)} machines: each row's [device, precision] says where; runs made on "
                 f"different ones are never averaged or paired.")
        out += ["", table_title(budget, setting, ir), "", where, "",
                "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for method, buf, device, precision, label in rows:
            line = ["-" if buf is None else str(buf), label]
            for d, n in cols:
                g = by_key.get((method, buf, device, precision, d, n))
                # The paper's numbers sit beside the full protocol only: a cheaper budget is
                # compared within its own table.
                pc, pt = (paper_numbers(setting, ir, d, method, buf)
                          if metric == "acc" and budget == "full protocol" else (None, None))
                ptasks = PAPER_N_TASKS.get((setting, d))
                line += [_cell(g, "class_il", metric, pc, ptasks, n),
                         _cell(g, "task_il", metric, pt, ptasks, n)]
            out.append("| " + " | ".join(line) + " |")
        paired = paired_lines(gs, metric)
        if paired:
            out += ["", f"Paired with {_reference()}: its {metric.upper()} minus the row's over the n seeds both ran "
                        f"(on one machine): the mean difference, its 95% interval (Student's t, n-1 degrees of "
                        f"freedom), and on how many seeds {_reference()} is higher; rows sharing fewer than {MIN_PAIRS} "
                        f"seeds left out." + (f" Higher forgetting is worse: a positive difference is {_reference()} "
                                              f"forgetting more." if metric == "forgetting" else ""), ""] + paired
        notes = ([note for g in gs for note in g.notes] + _tuned_lr_notes(gs) + _unknown_machine_notes(gs)
                 + _pooled_confirmation_notes(gs) + _reserved_seed_notes(gs))
        if notes:
            out += [""] + [f"- note: {note}" for note in notes]
    skipped = list(skipped)
    if skipped:
        out += [""] + [f"- note: {s}" for s in skipped]
    return "\n".join(out) + "\n"


def sorted_tables(groups: Iterable[Group]) -> list[tuple[tuple, list[Group]]]:
    """((budget, setting, IR), its groups) in the report's order."""
    return sorted(_tables(groups).items(),
                  key=lambda kv: (_budget_rank(kv[0][0]), _setting_rank(kv[0][1]), kv[0][2]))


def table_title(budget: str, setting: str, ir: float) -> str:
    return f"## {setting}, IR {_fmt_ir(ir)}" + ("" if budget == "full protocol" else f" ({budget})")


def _unknown_machine_notes(groups: list[Group]) -> list[str]:
    n_device = sum(len(g.runs) for g in groups if g.device == UNKNOWN)
    n_precision = sum(len(g.runs) for g in groups if g.precision == UNKNOWN)
    notes = []
    if n_device:
        notes.append(f"{n_device} run(s) record no device (no pbr.device tag, train.device auto): read as "
                     f"'device unknown', kept apart from runs whose device is known")
    if n_precision:
        notes.append(f"{n_precision} run(s) record no precision (train.precision auto, no resolved.precision tag): "
                     f"read as 'precision unknown', kept apart from runs whose precision is known")
    return notes


def _reference() -> str:
    """The row every other is paired with: the paper's own method ("ours") at its defaults."""
    from pbr.methods import METHODS

    return next(cls.label for cls in METHODS.values() if cls.role == "ours")


MIN_PAIRS = 2


def _t_within(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with integer df: the finite series of Abramowitz & Stegun 26.7.3/4
    (exact, no scipy needed)."""
    theta = math.atan(t / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2:
        term = total = math.cos(theta)  # cos θ + (2/3) cos³θ + (2·4)/(3·5) cos⁵θ + ..., up to cos^(df-2)
        for j in range(1, (df - 1) // 2):
            term *= 2 * j / (2 * j + 1) * c2
            total += term
        return 2 / math.pi * (theta + (math.sin(theta) * total if df > 1 else 0.0))
    term = total = 1.0  # 1 + (1/2) cos²θ + (1·3)/(2·4) cos⁴θ + ..., up to cos^(df-2)
    for j in range(df // 2 - 1):
        term *= (2 * j + 1) / (2 * j + 2) * c2
        total += term
    return math.sin(theta) * total


@functools.lru_cache(maxsize=None)
def t_quantile(df: int, level: float = 0.95) -> float:
    """The two-sided `level` critical value of Student's t with `df` degrees of freedom
    (t_{0.975, df} for 0.95): bisection on the exact distribution function."""
    if df < 1:
        raise ValueError(f"t_quantile: df = {df}, needs at least 1")
    lo, hi = 0.0, 1.0
    while _t_within(hi, df) < level:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_within(mid, df) < level else (lo, mid)
    return (lo + hi) / 2


@dataclass(frozen=True)
class Paired:
    """PBR minus a row over the seeds both ran."""

    mean: float
    low: float   # the 95% interval: mean ± t_{0.975, n-1} · sd / √n
    high: float
    wins: int    # seeds where PBR is higher
    n: int       # seeds both ran

    def text(self) -> str:
        return f"{self.mean:+.2f}, 95% CI [{self.low:+.2f}, {self.high:+.2f}] (higher on {self.wins} of n={self.n})"


def _paired(a: dict[str, float], b: dict[str, float]) -> Paired | None:
    """a - b over the seeds both have; None under MIN_PAIRS of them."""
    d = [a[s] - b[s] for s in sorted(a.keys() & b.keys())]
    if len(d) < MIN_PAIRS:
        return None
    mean, half = statistics.fmean(d), t_quantile(len(d) - 1) * statistics.stdev(d) / math.sqrt(len(d))
    return Paired(mean, mean - half, mean + half, sum(x > 0 for x in d), len(d))


def paired_lines(groups: list[Group], metric: str = "acc") -> list[str]:
    """One line per row of the table that shares seeds with PBR's row of the same dataset and
    buffer: PBR minus the row, Class-IL and Task-IL."""
    lines = []
    refs = {(g.dataset, g.n_tasks, g.buffer_size, g.device, g.precision): g for g in groups if g.method == _reference()}
    for g in sorted(groups, key=lambda g: (_col_order(g.dataset, g.n_tasks), _row_order(g.method, g.buffer_size),
                                           _machine_rank(g.device, g.precision))):
        ref = refs.get((g.dataset, g.n_tasks, g.buffer_size, g.device, g.precision))
        if ref is None or g is ref:
            continue
        cells = []
        for mode, name in (("class_il", "Class-IL"), ("task_il", "Task-IL")):
            p = _paired(ref.by_seed(mode, metric), g.by_seed(mode, metric))
            if p is not None:
                cells.append(f"{name} {p.text()}")
        if cells:
            lines.append(f"- {_reference()} - {g.describe()}: {'; '.join(cells)}")
    return lines


def _tuned_lr_notes(groups: list[Group]) -> list[str]:
    """Say, in one note, which methods ran at their own tuned lr rather than the paper's single 0.03
    (those sharing an lr and its source named together)."""
    tuned_at: dict[tuple[float, str], list[str]] = {}
    for label in sorted({g.method for g in groups}):
        first = next(g for g in groups if g.method == label).runs[0].params
        cls = _method(first.get("method.name", ""))
        if cls is None:
            continue
        lr = float(resolved({**first, "train.lr": "auto"})["train.lr"])
        if abs(lr - PAPER_LR) < 1e-12:
            continue
        tuned = all(float(resolved(r.params)["train.lr"]) == lr for g in groups if g.method == label
                    for r in g.runs)
        if tuned:
            _, source = cls.resolve("lr", "auto", first.get("data.dataset", "cifar10"),
                                    int(first.get("method.buffer_size", "0") or 0))
            tuned_at.setdefault((lr, source), []).append(label)
    if not tuned_at:
        return []
    return [f"the paper ran every method at lr {PAPER_LR:g}; these ran at their own lr (row 'NAME (lr "
            f"{PAPER_LR:g})' where run): " + "; ".join(f"{', '.join(labels)} {lr:g} ({source})"
                                                   for (lr, source), labels in tuned_at.items())]


def _num(x: float | None) -> str:
    return "" if x is None else f"{x:.4f}"


def csv_rows(groups: list[Group], metric: str = "acc") -> list[dict[str, str]]:
    rows = []
    for g in groups:
        c, t = g.stats("class_il", metric), g.stats("task_il", metric)
        pc, pt = g.paper() if metric == "acc" and g.budget == "full protocol" else (None, None)
        rows.append({
            "budget": g.budget, "setting": g.setting, "imbalance_ratio": _fmt_ir(g.imbalance_ratio), "dataset": g.dataset,
            "method": g.method, "buffer_size": "" if g.buffer_size is None else str(g.buffer_size),
            "n_runs": str(len(g.runs)),
            # The spread of one seed is no figure: left empty, and each mode's own n beside it (a
            # metric some runs did not log has fewer seeds than the row).
            "class_il_mean": _num(c and c[0]), "class_il_std": _num(c[1] if c and c[2] > 1 else None),
            "task_il_mean": _num(t and t[0]), "task_il_std": _num(t[1] if t and t[2] > 1 else None),
            "paper_class_il": _num(pc), "paper_task_il": _num(pt), "metric": metric,
            "n_tasks": "" if g.n_tasks is None else str(g.n_tasks),
            "paper_n_tasks": "" if g.paper_n_tasks() is None else str(g.paper_n_tasks()),
            "device": g.device, "precision": g.precision,
            "n_seeds": str(len({r.params.get("seed", "") for r in g.runs})),
            "class_il_n": str(c[2] if c else 0), "task_il_n": str(t[2] if t else 0),
            # Which: a report of some seeds (`--seeds`) writes the same file as the full one.
            "seeds": seed_text(s for r in g.runs if (s := r.params.get("seed", "")).isdigit()),
        })
    return rows


def write_csv(groups: list[Group], path: Path, metric: str = "acc") -> None:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerows(csv_rows(groups, metric))
    artifacts.write_text(path, buf.getvalue())


def no_runs_message(tracking_uri: str, experiment: str, command: str = "pbr report") -> str:
    return (f"No finished pipeline runs in MLflow experiment '{experiment}' at {tracking_uri}: "
            f"produce some with `dvc repro` (or `dvc exp run`), or copy a teammate's with `pbr import` (data pulled "
            f"with `dvc pull` brings no MLflow runs), then run `{command}` again.")


def report_experiment(experiment: str) -> str:
    """Where `pbr report` logs its files: an experiment of its own beside the runs' (pbr -> pbr-report),
    so the report's runs are never rows of a table nor clutter the training runs' charts."""
    return f"{experiment}-report"


def log_to_mlflow(uri: str, experiment: str, rep: Report, metric: str, flag: bool = False) -> str:
    """One run of report_experiment(experiment) holding the figures, the CSV and the markdown;
    returns its id."""
    import datetime

    from stages.runtime.tracking import open_experiment

    # As the stages open theirs: artifacts beside a sqlite store, following it where it moved.
    client, exp_id = open_experiment(uri, report_experiment(experiment), flag)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    n_runs = sum(len(g.runs) for g in rep.groups)
    r = client.create_run(exp_id, run_name=f"report {metric} {now}",
                          tags={"pbr.report": "true", "pbr.report.source": experiment,
                                "mlflow.note.content": f"`pbr report --metric {metric}` over {n_runs} runs of "
                                                       f"experiment '{experiment}' (docs/report.md)"})
    from mlflow.entities import Param

    client.log_batch(r.info.run_id, params=[Param("metric", metric), Param("experiment", experiment),
                                            Param("n_runs", str(n_runs)), Param("n_rows", str(len(rep.groups)))])
    for path in rep.figures:
        client.log_artifact(r.info.run_id, str(path), "figures")
    client.log_text(r.info.run_id, rep.text, "report.md")
    client.log_text(r.info.run_id, runs_csv(rep.groups), "runs.csv")
    if rep.csv_path is not None:
        client.log_artifact(r.info.run_id, str(rep.csv_path))
    client.set_terminated(r.info.run_id, "FINISHED")
    return r.info.run_id


def runs_csv(groups: list[Group]) -> str:
    """Every run the report counted, with what traces it: its row, seed, code commit and prepared
    data (the report's MLflow run keeps this beside the tables)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["run_id", "table", "row", "dataset", "n_tasks", "seed", "git_commit", "git_dirty", "data_manifest"])
    for g in groups:
        for r in g.runs:
            w.writerow([r.run_id, table_title(g.budget, g.setting, g.imbalance_ratio).lstrip("# "), g.describe(),
                        g.dataset, g.n_tasks, r.params.get("seed", ""), r.tags.get("git.commit", ""),
                        r.tags.get("git.dirty", ""), r.tags.get("pbr.data_manifest", "")])
    return buf.getvalue()


def figure_tables(groups: list[Group], metric: str) -> list[tuple[str, list[Group], bool]]:
    """(title, groups, paper marks?) per table: the paper's numbers sit beside the full protocol's
    accuracy only, as in the printed tables."""
    return [(table_title(*key), gs, metric == "acc" and key[0] == "full protocol")
            for key, gs in sorted_tables(groups)]


def run(tracking_uri: str | None = None, experiment: str = DEFAULT_EXPERIMENT, metric: str = "acc",
        csv_path: Path | None = DEFAULT_CSV, markdown_path: Path | None = None,
        figures_dir: Path | None = None, log_mlflow: bool = False, seeds: list[int] | None = None) -> Report:
    """Build the report (from the runs of `seeds` only, if given); write the CSV (and markdown file,
    and a PNG per table under `figures_dir`) when there are runs, and with `log_mlflow` log them to
    report_experiment(experiment); with none, empty what an earlier report wrote there (it would
    read as current). Prints nothing."""
    if metric not in METRICS:
        raise UserError(f"--metric {metric}: not one of {', '.join(METRICS)}")
    # Checked before anything is written: a bad --figures found after the CSV left the outputs half new.
    for option, path, folder in (("--csv", csv_path, False), ("--markdown", markdown_path, False),
                                 ("--figures", figures_dir, True)):
        if path is not None and Path(path).exists() and Path(path).is_dir() != folder:
            raise UserError(f"{option} {path}: {'a file' if folder else 'a folder'} is there; give a "
                            f"{'folder' if folder else 'file'}'s path")
    uri = tracking_uri or _default_uri()
    runs = collect_runs(uri, experiment, flag=tracking_uri is not None)
    filtered = False
    if runs and seeds is not None:
        kept = [r for r in runs if r.params.get("seed") in {str(s) for s in seeds}]
        filtered, runs = not kept, kept
    groups, skipped = group_runs(runs or [])
    if not groups:
        text = no_runs_message(uri, experiment)
        if seeds is not None and runs is not None:
            text = text.replace("No finished pipeline runs", f"No finished pipeline runs of seeds {seed_text(seeds)}")
        if skipped:
            text += f" ({len(skipped)} complete run(s) lack a seed or data.* / method.* params.)"
        # No such store or experiment (a typo, another store), or no run of the seeds asked for (the
        # store has runs: the last full report's files are still true): leave the files alone.
        if runs is None or filtered:
            return Report(text + "\n", [])
        if csv_path is not None and Path(csv_path).is_file():
            write_csv([], Path(csv_path), metric)
        if figures_dir is not None and Path(figures_dir).is_dir():
            from stages.experiments.report_figures import write_figures

            write_figures([], metric, Path(figures_dir))
        return Report(text + "\n", [])
    text = render_markdown(groups, metric, skipped, seeds)
    if csv_path is not None:
        write_csv(groups, Path(csv_path), metric)
    if markdown_path is not None:
        artifacts.write_text(Path(markdown_path), text)
    rep = Report(text, groups, Path(csv_path) if csv_path is not None else None,
                 Path(markdown_path) if markdown_path is not None else None)
    if figures_dir is not None:
        from stages.experiments.report_figures import write_figures

        rep.figures = write_figures(figure_tables(groups, metric), metric, Path(figures_dir), seeds)
    if log_mlflow:
        try:
            rep.mlflow_run = log_to_mlflow(uri, experiment, rep, metric, flag=tracking_uri is not None)
        except Exception as e:  # the report is made; a store that refuses writes must not lose it
            from stages.runtime.tracking import store_error

            rep.warnings.append("not logged to MLflow: " + store_error(
                uri, e, "the report's files are on disk; run with --no-log to skip logging"))
    return rep
