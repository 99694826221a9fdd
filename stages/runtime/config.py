"""params.yaml -> one typed, validated Config. Every stage reads its settings through here.

Each key is a dataclass field whose metadata says what is allowed; unknown keys, wrong
types and bad values are rejected as one line naming the key and what it may be.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

from pbr.data.facts import DATASETS
from pbr.errors import UserError
from stages.runtime.yaml12 import read_params

N_CLASSES = {k: d.n_classes for k, d in DATASETS.items()}


class ConfigError(UserError):
    pass


def _key(check: Callable[[Any], bool] | None = None, allowed: str = "", **kw) -> Any:
    return field(metadata={"check": check, "allowed": allowed}, **kw)


MAX_THREADS = 1024  # train.threads: more than any machine's cores (OpenMP and Arrow fail far above it)


def _positive(v) -> bool:
    return v > 0


@dataclass(frozen=True)
class DataConfig:
    dataset: Literal[tuple(DATASETS)] = "cifar10"  # type: ignore[valid-type]
    root: str = _key(default="data/raw", allowed="a folder path holding (or receiving) the raw archives")
    download: bool = True
    setting: Literal["ordered", "shuffled"] = "ordered"
    imbalance_ratio: float = _key(
        lambda v: 0 < v <= 1, "a number with 0 < IR <= 1 (1 = balanced)", default=0.01
    )
    n_tasks: int = _key(_positive, "a positive integer dividing the number of classes", default=5)
    # Drives the shuffled class order (numpy RandomState permutation, 1993 as in LT-CIL)
    # and, under subset seeded, the choice of which images of a class are kept.
    seed: int = _key(lambda v: 0 <= v < 2**32, "an integer in [0, 2^32)", default=1993)
    # Which images a class keeps: seeded (drawn from data.seed) | ldam (LDAM-DRW's and LT-CIL's
    # code: the exact images they train on).
    subset: Literal["seeded", "ldam"] = "seeded"
    shard_mb: float = _key(lambda v: 0 < v <= 2**20, "a number of megabytes per parquet shard in (0, 1048576]",
                           default=64.0)


# Keys added after runs and prepared data were recorded, with what one that lacks the key ran with
# (the report reads old runs, an offline sweep old prepared data, with these).
ADDED_LATER = {"data.subset": "seeded", "train.lr_milestones": "[]"}

# Data keys that do not change what is prepared: where the archive is, whether it may be fetched
# (neither is in the manifest), how the parquet is cut.
NOT_CONTENT = ("root", "download", "shard_mb")


def refuse_stale(cfg: Config, manifest: dict) -> None:
    """The train, score and evaluate stages read data/prepared as it was built: params.yaml's data
    section must still say what built it, else the run would be recorded under settings it did not
    train on (one line naming the first key that differs)."""
    from stages.runtime.paths import PREPARED

    before = {k.removeprefix("data."): v for k, v in ADDED_LATER.items() if k.startswith("data.")}
    built, now = {**before, **(manifest.get("params") or {})}, cfg.to_dict()["data"]
    for key, value in now.items():
        if key not in NOT_CONTENT and key in built and built[key] != value:
            raise UserError(f"{PREPARED} was built with data.{key} = {built[key]!r} but the params file says "
                            f"{value!r}; run `dvc repro` (or pbr prepare, then the stages after it)")


def _non_negative(v) -> bool:
    return v >= 0


Auto = Literal["auto"]


def _method_config() -> type:
    """The `method` section from the method registry (pbr/methods): name, buffer_size and the
    shared keys, then one section per method holding the keys it alone reads (method.pbr.tau1,
    method.ewc_on.gamma): two methods' keys never collide, and a new method's settings need no
    edit here."""
    from pbr.methods import METHODS

    fields: list = [
        # The default method is the one the paper proposes.
        ("name", Literal[tuple(METHODS)], field(default=next(n for n, c in METHODS.items() if c.role == "ours"))),
        ("buffer_size", int, _key(_non_negative, "an integer >= 0", default=200)),
    ]
    shared: dict[str, Any] = {}
    for cls in METHODS.values():
        for s in cls.settings:
            if not s.shared:
                continue
            first = shared.setdefault(s.key, s)
            if (first.type, first.default, first.allowed) != (s.type, s.default, s.allowed):
                raise TypeError(f"method.{s.key} is shared but declared differently by two methods (one is "
                                f"{cls.name}); declare it alike (share one Setting)")
    for s in shared.values():
        fields.append((s.key, s.type, _key(s.check, s.allowed, default=s.default)))
    for cls in METHODS.values():
        own = [(s.key, s.type, _key(s.check, s.allowed, default=s.default)) for s in cls.settings if not s.shared]
        if own:
            section = dataclasses.make_dataclass(f"{cls.name}_config", own, frozen=True)
            fields.append((cls.name, section, field(default_factory=section)))
    return dataclasses.make_dataclass("MethodConfig", fields, frozen=True)


def method_values(method) -> dict[str, Any]:
    """The keys the running method (method.name) reads, as given: its own section and the shared keys
    it declares, by their bare names (what the method's `options` takes)."""
    from pbr.methods import METHODS

    cls = METHODS[method.name]
    section = getattr(method, cls.name, None)
    return {s.key: getattr(method if s.shared else section, s.key) for s in cls.settings}


def unwritten_keys(method) -> set[str]:
    """The running method's keys params.yaml left out (a section not shipped yet): they took their
    declared defaults. None known for a Config not read from a file (built by hand, or replaced)."""
    from pbr.methods import METHODS

    cls = METHODS[method.name]
    section = getattr(method, cls.name, None)
    return {s.key for s in cls.settings
            if s.key not in getattr(method if s.shared else section, "_written", {s.key})}


def _moved(key: str) -> str | None:
    """Where a method key of the old flat spelling (method.tau1) lives now, or None."""
    from pbr.methods import METHODS

    owners = [cls.name for cls in METHODS.values() if any(s.key == key and not s.shared for s in cls.settings)]
    if not owners:
        return None
    return " or ".join(f"'method.{o}.{key}'" for o in owners)


MethodConfig = _method_config()


@dataclass(frozen=True)
class TrainConfig:
    # One number for every task, or a list with one entry per task (a per-task budget).
    epochs: int | tuple[int, ...] = _key(
        lambda v: v > 0 if isinstance(v, int) else len(v) > 0 and all(e > 0 for e in v),
        "a positive integer, or a list of positive integers with one entry per task", default=50)
    batch_size: int = _key(_positive, "a positive integer", default=32)
    replay_batch_size: int = _key(_positive, "a positive integer", default=32)
    eval_batch_size: int = _key(_positive, "a positive integer", default=128)
    lr: float | Auto = _key(_positive, "a positive number or auto", default="auto")
    # Fractions of a task's epochs after which the lr drops tenfold, restarting each task (Mammoth's
    # MultiStepLR: [0.7, 0.9] of 50 epochs drops after epochs 35 and 45); auto: the method's own.
    lr_milestones: tuple[float, ...] | Auto = _key(
        lambda v: all(0 < f < 1 for f in v) and all(a < b for a, b in zip(v, v[1:])),
        "auto, or a list of strictly increasing fractions of a task's epochs in (0, 1) ([] for a constant lr)",
        default="auto")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # bf16 autocast of the training step (evaluation stays fp32); channels_last memory format.
    # auto: decided from the device (stages/runtime/hardware.py), recorded in run.json and MLflow.
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    channels_last: bool | Auto = _key(None, "true, false or auto", default="auto")
    # torch.compile of the model's forward (and its backward): faster steps after a compile per
    # batch shape, so worth it for long runs only (docs/benchmarks.md). graphs: the same as CUDA
    # graphs (mode reduce-overhead), which remove a GPU step's launch cost (docs/gpu.md).
    compile: bool | Literal["graphs"] = _key(None, "true, false or graphs (CUDA graphs, on a GPU)", default=False)
    # CPU threads of torch: auto = the cores, shared among live `dvc queue` workers (stages/runtime/threads.py).
    # Capped: 100000 failed in Arrow's reader as if the data were damaged, 20000 in libgomp's thread creation.
    threads: int | Auto = _key(lambda v: 0 < v <= MAX_THREADS, f"a positive integer up to {MAX_THREADS}, or auto",
                               default="auto")


@dataclass(frozen=True)
class ModelConfig:
    width: int = _key(lambda v: 0 < v <= 1024, "a positive integer up to 1024 (64 in the paper)", default=64)
    head: Literal["auto", "cosine", "linear"] = "auto"
    scale: float = _key(_positive, "a positive number (s = 10 in the paper)", default=10.0)
    dropout: float | Auto = _key(lambda v: 0 <= v < 1, "a number in [0, 1) or auto", default="auto")


@dataclass(frozen=True)
class ScoreConfig:
    # MC dropout needs a dropout rate: "auto" uses the trained one, or 0.1 for a net trained without.
    dropout: float | Auto = _key(lambda v: 0 < v < 1, "a number in (0, 1) or auto", default="auto")
    # softmax temperature of the MC probabilities: "auto" = the trained run's own (its method answers).
    # Below 1e-6 logits / T overflow float32 to inf, and the MI is NaN.
    temperature: float | Auto = _key(lambda v: v >= 1e-6, "a number >= 1e-6 or auto", default="auto")
    # T, the MC-dropout passes: "auto" = the trained run's own T where its method scores while
    # training (PBR's method.pbr.mc_samples), else 20. One sample's mutual information is always 0.
    mc_samples: int | Auto = _key(lambda v: v >= 2, "an integer >= 2 or auto", default="auto")


@dataclass(frozen=True)
class Config:
    seed: int = _key(lambda v: 0 <= v < 2**32, "an integer in [0, 2^32) (the training seed)", default=0)
    data: DataConfig = field(default_factory=DataConfig)
    method: MethodConfig = field(default_factory=MethodConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    score: ScoreConfig = field(default_factory=ScoreConfig)

    def epochs_of(self, task: int) -> int:
        """The epochs of `task` (train.epochs is one number or one entry per task)."""
        e = self.train.epochs
        return e if isinstance(e, int) else e[task]

    @property
    def n_classes(self) -> int:
        return N_CLASSES[self.data.dataset]

    def to_dict(self) -> dict:
        # Lists as YAML and JSON write them (a per-task train.epochs is a tuple here).
        return dataclasses.asdict(self, dict_factory=lambda kv: {k: list(v) if isinstance(v, tuple) else v
                                                                 for k, v in kv})

    def flat(self, every_method: bool = False) -> dict[str, Any]:
        """Dotted keys, as `dvc exp run -S` and MLflow params spell them; of the method sections,
        the running method's only (another method's keys cannot change this run), or with
        `every_method` all of them (params.yaml's shape)."""
        out: dict[str, Any] = {}

        def walk(prefix: str, d: dict) -> None:
            for k, v in d.items():
                if isinstance(v, dict):
                    walk(f"{prefix}{k}.", v)
                else:
                    out[prefix + k] = v

        d = self.to_dict()
        d["method"] = {k: v for k, v in d["method"].items()
                       if every_method or not isinstance(v, dict) or k == self.method.name}
        walk("", d)
        return out


def _describe(tp, meta: dict) -> str:
    if meta.get("allowed"):
        return meta["allowed"]
    if typing.get_origin(tp) is Literal:
        return "one of " + " | ".join(map(str, typing.get_args(tp)))
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(tp, str(tp))


_NO = object()


def _convert(tp, value: Any) -> Any:
    """`value` as type `tp`, or _NO when it is not one."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for arm in typing.get_args(tp):
            v = _convert(arm, value)
            if v is not _NO:
                return v
        return _NO
    if origin is Literal:
        return value if isinstance(value, (str, bool, int)) and value in typing.get_args(tp) else _NO
    if tp is bool:
        return value if isinstance(value, bool) else _NO
    if tp is int:
        return value if isinstance(value, int) and not isinstance(value, bool) else _NO
    if tp is float:
        try:  # an int beyond a float's range (1 followed by 400 zeros) overflows math.isfinite
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        except OverflowError:
            return _NO
        return float(value) if ok else _NO
    if tp is str:
        return value if isinstance(value, str) and value else _NO
    if origin is tuple:  # tuple[X, ...]: a YAML list of X
        if not isinstance(value, (list, tuple)):
            return _NO
        items = [_convert(typing.get_args(tp)[0], v) for v in value]
        return _NO if any(v is _NO for v in items) else tuple(items)
    raise TypeError(f"unsupported config type {tp}")


def _coerce(name: str, tp, meta: dict, value: Any, source: str) -> Any:
    converted = _convert(tp, value)
    check = meta.get("check")
    # "auto" (a method's documented default) is never range-checked.
    if converted is _NO or (check is not None and converted != "auto" and not check(converted)):
        raise ConfigError(f"{source}: {name} = {value!r} is not allowed; it must be {_describe(tp, meta)}")
    return converted


def _build(cls, raw: Any, prefix: str, source: str):
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        # `lr:0.1` without its space is YAML's text "lr:0.1", not a key and its value.
        spaced = (f"; it is the text {raw!r}: a space after the colon? (key: value)"
                  if isinstance(raw, str) and ":" in raw else "")
        raise ConfigError(f"{source}: {prefix.rstrip('.') or 'the file'} must be a mapping of keys to values{spaced}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in raw.items():
        if key not in fields:
            moved = _moved(str(key)) if prefix == "method." else None
            if moved:
                raise ConfigError(f"{source}: '{prefix}{key}' is now spelled {moved} (each method's own keys "
                                  f"live under its name); move it there")
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = f" (did you mean '{prefix}{close[0]}'?)" if close else ""
            if ":" in str(key) and str(key).split(":", 1)[0].strip() in fields:  # {lr:0.1}: one key, "lr:0.1"
                hint = " (a space after the colon?)"
            where = f"'{prefix.rstrip('.')}'" if prefix else "the top level"
            raise ConfigError(
                f"{source}: unknown key '{prefix}{key}'{hint}; allowed in {where}: {', '.join(fields)}"
            )
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = _build(tp, value, f"{prefix}{key}.", source)
        else:
            kwargs[key] = _coerce(prefix + key, tp, fields[key].metadata, value, source)
    built = cls(**kwargs)
    # The keys written (not fields: equality and to_dict stay the values'): a key left out took its
    # declared default, which run.json's `sources` says (unwritten_keys). A section left out wrote none.
    object.__setattr__(built, "_written", frozenset(kwargs))
    for f in dataclasses.fields(cls):
        if f.name not in kwargs:
            _none_written(getattr(built, f.name, None))
    return built


def _none_written(section) -> None:
    if dataclasses.is_dataclass(section):
        object.__setattr__(section, "_written", frozenset())
        for f in dataclasses.fields(section):
            _none_written(getattr(section, f.name))


def _cross_checks(cfg: Config, source: str) -> None:
    from pbr.methods import METHODS

    if METHODS[cfg.method.name].uses_buffer and cfg.method.buffer_size < 1:
        raise ConfigError(f"{source}: method.buffer_size = {cfg.method.buffer_size} leaves {cfg.method.name} "
                          f"without a replay buffer; use a size >= 1 (200 or 500 in the paper)")
    n_classes, n_tasks = cfg.n_classes, cfg.data.n_tasks
    _refuse_an_empty_class(cfg, source)
    method = METHODS[cfg.method.name]
    own = getattr(cfg.method, cfg.method.name, None)
    least, why = method.least_buffer(n_classes, n_tasks, dataclasses.asdict(own) if dataclasses.is_dataclass(own) else {})
    if method.uses_buffer and cfg.method.buffer_size < least:
        raise ConfigError(f"{source}: method.buffer_size = {cfg.method.buffer_size} is too small for "
                          f"{cfg.method.name} on {cfg.data.dataset}'s {n_classes} classes in {n_tasks} tasks: its "
                          f"memory needs {why}; use at least {least}")
    epochs = cfg.train.epochs
    if isinstance(epochs, tuple) and len(epochs) != n_tasks:
        raise ConfigError(f"{source}: train.epochs = {list(epochs)} has {len(epochs)} entries but data.n_tasks = "
                          f"{n_tasks}; give one entry per task, or one number for all")
    if n_classes % n_tasks:
        divisors = [d for d in range(1, n_classes + 1) if n_classes % d == 0]
        raise ConfigError(
            f"{source}: data.n_tasks = {n_tasks} does not divide the {n_classes} classes of "
            f"{cfg.data.dataset}; use one of {', '.join(map(str, divisors))}"
        )


def _refuse_an_empty_class(cfg: Config, source: str) -> None:
    """The ratio leaves the stream's last class an image of the full data set (prepare checks the
    data it reads too): refused here, before the raw data is read and a stage's run begins."""
    from pbr.data.longtail import class_counts, least_ratio

    facts, ir = DATASETS[cfg.data.dataset], cfg.data.imbalance_ratio
    if class_counts(facts.n_max, facts.n_classes, ir).min() < 1:
        raise ConfigError(f"{source}: data.imbalance_ratio = {ir:g} leaves {cfg.data.dataset}'s last class no "
                          f"training image (int({facts.n_max} * IR) = 0); use a ratio >= {least_ratio(facts.n_max):g}")


def from_dict(raw: Any, source: str = "params.yaml") -> Config:
    cfg = _build(Config, raw, "", source)
    _cross_checks(cfg, source)
    return cfg


def load_config(path: str | Path = "params.yaml") -> Config:
    path = Path(path)
    return from_dict(read_params(path, ConfigError), str(path))
