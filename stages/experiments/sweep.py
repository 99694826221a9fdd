"""`pbr sweep NAME`: the paper's grids queued as DVC experiments.

Each run of a grid is `dvc exp run --queue -n NAME -S key=value ...`, queued through DVC's own
Python entry point (the one its CLI calls: 0.1 s a run instead of 2 s a `dvc` process). The grid
sets only the keys that make a table's row (dataset, tasks, setting, IR, method, buffer, walk
order, head) and the seed; everything else (epochs, width, ...) comes from params.yaml, which holds
the paper's protocol and the measured readings of its open points (docs/method.md). Runs already
finished or waiting in the queue under the same name (for the current commit) are skipped, so
re-running a sweep after a crash queues only what is missing.
Run the queue with `dvc queue start -j N`, then `pbr report` builds the tables from MLflow.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import yaml

from pbr.data.facts import DATASETS as FACTS
from pbr.errors import UserError
from pbr.readings import READINGS, Readings
from stages.experiments.paper_results import PAPER_N_TASKS
from stages.runtime.yaml12 import read_params, read_yaml

DATASETS = tuple(FACTS)
SHORT = {k: d.short for k, d in FACTS.items()}


def _task(setting: str, dataset: str, ir: float) -> dict[str, Any]:
    return {"data.dataset": dataset, "data.n_tasks": PAPER_N_TASKS[(setting, dataset)],
            "data.setting": setting, "data.imbalance_ratio": ir}


def _method(name: str, buffer: int | None = None, variant: str | None = None, head: str = "auto"
            ) -> dict[str, Any]:
    """A method's keys; `variant` one of the method's named ablations (its `ablations`: PBR's
    "random" and "reservoir", the paper's "Ours - Random" in its two readings), None the method as
    params.yaml has it."""
    from pbr.methods import METHODS

    m: dict[str, Any] = {"method.name": name, "model.head": head}
    if buffer is not None:
        m["method.buffer_size"] = buffer
    if variant is not None:
        m.update({f"method.{name}.{k}": v for k, v in METHODS[name].ablations[variant].items()})
        m["_variant"] = variant
    return m


def _ours():
    """The method the paper proposes (role "ours")."""
    from pbr.methods import METHODS

    return next(cls for cls in METHODS.values() if cls.role == "ours")


def _variants(cls) -> tuple[str | None, ...]:
    """The method, then each of its named ablations."""
    return (None, *cls.ablations)


def _taking_part(grid: str) -> list:
    """The methods that declare (themselves, not by inheritance) that they take part in `grid`."""
    from pbr.methods import METHODS

    return [cls for cls in METHODS.values() if grid in vars(cls).get("grids", ())]


def table2(base: dict | None = None) -> Iterator[dict[str, Any]]:
    """Table 2: every registered method on the three datasets, ordered, IR 0.01, buffer 200 and
    500 for the rehearsal methods; the bounds (SGD, JOINT) also on the balanced stream (IR 1, the
    paper's -BL rows); PBR as "Ours" and "Ours - Random"."""
    from pbr.methods import METHODS

    for ds in DATASETS:
        for ir in (0.01, 1.0):
            for cls in METHODS.values():
                if cls.role == "bound":
                    yield {**_task("ordered", ds, ir), **_method(cls.name)}
        for cls in METHODS.values():
            if cls.role == "baseline" and not cls.uses_buffer:
                yield {**_task("ordered", ds, 0.01), **_method(cls.name)}
        for buffer in (200, 500):
            for cls in METHODS.values():
                if cls.role == "baseline" and cls.uses_buffer:
                    yield {**_task("ordered", ds, 0.01), **_method(cls.name, buffer)}
            ours = _ours()
            for variant in _variants(ours):
                yield {**_task("ordered", ds, 0.01), **_method(ours.name, buffer, variant)}


def table1(base: dict | None = None) -> Iterator[dict[str, Any]]:
    """Table 1: the long-tailed continual learning methods (role "ltcl": PODNet+) against PBR on
    ordered Seq-CIFAR-100-LT, IR 0.01, buffer 500 (the paper's "Ours" there is its buffer-500 row)."""
    from pbr.methods import METHODS

    for cls in METHODS.values():
        if cls.role in ("ltcl", "ours"):
            yield {**_task("ordered", "cifar100", 0.01), **_method(cls.name, 500)}


def table3(base: dict | None = None) -> Iterator[dict[str, Any]]:
    """Table 3: shuffled Seq-CIFAR-100-LT in 5 tasks, IR 0.01 / 0.02 / 0.05 / 0.1, buffer 200,
    DER++ against PBR."""
    for ir in (0.01, 0.02, 0.05, 0.1):
        for cls in (*_taking_part("table3"), _ours()):
            yield {**_task("shuffled", "cifar100", ir), **_method(cls.name, 200)}


def table5(base: dict | None = None) -> Iterator[dict[str, Any]]:
    """Table 5 (ablation): Seq-CIFAR-10-LT, ordered, IR 0.01; the buffer's sampling (the walk in
    params.yaml's order, in random order, or the online reservoir) x classifier (cosine / linear)
    at buffer 200, and no buffer (SGD) with either classifier."""
    for cls in _taking_part("table5"):
        for head in ("linear", "cosine"):
            yield {**_task("ordered", "cifar10", 0.01), **_method(cls.name, head=head)}
    ours = _ours()
    for variant in _variants(ours):
        for head in ("cosine", "linear"):
            yield {**_task("ordered", "cifar10", 0.01), **_method(ours.name, 200, variant, head)}


def fidelity(base: dict | None = None) -> Iterator[dict[str, Any]]:
    """The readings of the paper's open points (docs/method.md), on Seq-CIFAR-10-LT, ordered, IR
    0.01, buffer 200: the walk's order x offset counts, then one change at a time on params.yaml's
    PBR, PBR and its named ablations as params.yaml has them, the paper as written, and the
    comparator (ER) at the paper's single lr 0.03 and at Mammoth's tuned 0.1. Each cell names its
    row (`_row`); every other key comes from params.yaml."""
    base = base or {}
    ours = _ours()
    name = ours.name
    key = lambda k: k if "." in k else f"method.{name}.{k}"  # noqa: E731
    task = {**_task("ordered", "cifar10", 0.01), "method.buffer_size": 200}
    for cls in _taking_part("fidelity"):
        for lr in (0.03, 0.1):
            yield {**task, "method.name": cls.name, "train.lr": lr, "_row": f"{cls.name}-lr{lr:g}"}
    readings = READINGS.get(name, Readings())
    if readings.pair is not None:
        (a, a_values), (b, b_values) = readings.pair
        now = {a: _own_value(ours, base, a), b: _own_value(ours, base, b)}
        taken = [now, *({**now, **v} for v in ours.ablations.values())]  # rows of their own, below
        for vb in b_values:
            for va in a_values:
                if {a: va, b: vb} not in taken:
                    yield {**task, **_method(name, 200), key(a): va, key(b): vb,
                           "_row": f"{name}-{str(va).split('_')[0]}-{vb}"}
    for k, (short, values) in readings.one_at_a_time.items():
        now = _get(base, k) if "." in k else None  # train.lr: params.yaml's, else the method's own
        if now in ("auto", None):
            now = _own_value(ours, base, k.split(".")[-1])
        for v in values:
            if v != now:
                text = str(v).lower() if isinstance(v, bool) else f"{v:g}" if isinstance(v, float) else v
                yield {**task, "method.name": name, key(k): v, "_row": f"{name}-{short}{text}"}
    yield {**task, "method.name": name, "_row": name}
    for variant in ours.ablations:  # the paper's Ours - Random, in both readings
        yield {**task, "method.name": name, **{key(k): v for k, v in ours.ablations[variant].items()},
               "_row": f"{name}-{variant}"}
    if readings.literal:  # the paper as written, beside ours (docs/preregistration.md)
        yield {**task, "method.name": name, **{key(k): v for k, v in readings.literal.items()},
               "_row": f"{name}-literal"}


def _own_value(cls, base: dict, key: str) -> Any:
    """params.yaml's value of one of the method's own keys, "auto" read as the method's own (under
    params.yaml's preset, where the method has one)."""
    now = _get(base, f"method.{cls.name}.{key}") if key != "lr" else None
    if now in ("auto", None):
        presets = {s.key: _get(base, f"method.{cls.name}.{s.key}") for s in cls.settings if s.selects_defaults}
        opts, _ = cls.options("cifar10", 200, **{k: v for k, v in presets.items() if v is not None})
        now = getattr(opts, key)
    return now


def _get(d: dict, dotted: str) -> Any:
    for part in dotted.split("."):
        d = d.get(part, {}) if isinstance(d, dict) else {}
    return d if d != {} else None


def families(base: dict | None = None) -> Iterator[dict[str, Any]]:
    """Every registered method on Seq-CIFAR-10, ordered, balanced (IR 1) and long-tailed (IR 0.01),
    buffer 200: the check that the families rank as in Mammoth's published balanced results
    (rehearsal above regularisation, PNN near the top in Task-IL), and how the tail changes that."""
    from pbr.methods import METHODS

    for ir in (1.0, 0.01):
        for cls in METHODS.values():
            yield {**_task("ordered", "cifar10", ir), **_method(cls.name, 200 if cls.uses_buffer else None)}


GRIDS: dict[str, Callable[[dict | None], Iterator[dict[str, Any]]]] = {
    "table1": table1, "table2": table2, "table3": table3, "table5": table5, "fidelity": fidelity, "families": families}

# Budgets: settings put on every run of a grid. "full" is params.yaml as it is (the paper's
# protocol). "proxy" is the cheap stand-in for Seq-CIFAR-10-LT (ordered, IR 0.01, 5 tasks:
# PROXY_STREAM) that reproduces the full protocol's ranking (validated in docs/method.md): a
# narrow net, fewer epochs on the big head tasks and more on the small tail tasks, and the online
# reservoir offered each sample once per task, so that ER's buffer keeps the make-up it has at
# equal epochs.
BUDGETS: dict[str, dict[str, Any]] = {
    "full": {},
    "proxy": {"model.width": 8, "train.epochs": [4, 8, 16, 40, 80], "method.reservoir": "first_epoch"},
    # A first look on a CPU: width 8, one epoch a task (minutes a run; no ranking validated).
    "quick": {"model.width": 8, "train.epochs": 1},
}
# The stream the proxy was validated on; --budget proxy refuses a grid's cells on any other.
PROXY_STREAM: dict[str, Any] = {"data.dataset": "cifar10", "data.setting": "ordered", "data.imbalance_ratio": 0.01,
                                "data.n_tasks": 5}


@dataclass(frozen=True)
class Run:
    name: str                 # the DVC experiment name
    overrides: dict[str, Any]  # dotted key -> value, as `-S key=value`
    cost: float = 0.0          # expected cost, relative (expected_cost): what --shard balances
    row: str | None = None     # a fidelity cell's row name
    # Keys params.yaml lacks (a method's section not shipped yet): DVC's writer refuses a key it does not
    # find unless Hydra's `++` adds it; the config has validated them against the method's declaration.
    added: frozenset[str] = frozenset()

    def set_params(self) -> list[str]:
        return [f"{'++' * (k in self.added)}{k}={_override(v)}" for k, v in self.overrides.items()]

    def command(self) -> str:
        """The line to paste into a shell: each value quoted only where the shell needs it."""
        sets = " ".join(f"-S {_shell(s)}" for s in self.set_params())
        return f"dvc exp run --queue -n {shlex.quote(self.name)} {sets}"


# A string Hydra's override grammar (what `dvc exp run -S` parses) reads back as itself when bare: no
# character it lexes otherwise (~ # = , space quotes ...), and not a number, bool or null.
_BARE = re.compile(r"[A-Za-z_/][A-Za-z0-9_/.\-]*")
_NOT_BARE = {"true", "false", "null", "inf", "nan"}


def _override(v: Any) -> str:
    """A value as DVC's -S takes it (Hydra's override grammar). A string is a quoted Hydra string unless
    bare is the same: bare, `data.root=~/raw` fails to parse and `data.root=/x/raw,2` is a sweep of
    two experiments."""
    if isinstance(v, str):
        if _BARE.fullmatch(v) and v.lower() not in _NOT_BARE:
            return v
        # OmegaConf would resolve ${...} when DVC applies it: \${ is a literal ${ (a backslash before it
        # doubled). In the quotes, a quote is \' and the backslashes before a quote or the end are doubled.
        v = re.sub(r"(\\*)\$\{", lambda m: m.group(1) * 2 + "\\${", v)
        return "'" + re.sub(r"(\\*)('|$)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), v) + "'"
    if isinstance(v, list):
        return "[" + ", ".join(map(_override, v)) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_override(x)}" for k, x in v.items()) + "}"
    return yaml.safe_dump(v, default_flow_style=True).strip().removesuffix("\n...").strip()


def _shell(s: str) -> str:
    """`s` as one shell word: bare where it can be, else in single quotes, else (a Hydra-quoted value,
    which holds one) in double quotes."""
    if "'" not in s or "!" in s:
        return shlex.quote(s)
    return '"' + re.sub(r'([\\"$`])', r"\\\1", s) + '"'


def parse_assignments(items: list[str], option: str, many: bool = False) -> dict[str, Any]:
    """`key=value` strings (values read as YAML, as DVC reads `-S`) -> {key: value}; with `many`,
    `key=v1,v2` -> {key: [v1, v2]}."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise UserError(f"{option} {item!r}: write it as key=value, e.g. {option} train.epochs=5")
        try:
            if many:  # --only k=a --only k=b is --only k=a,b
                out.setdefault(key.strip(), []).extend(read_yaml(v) for v in value.split(","))
            else:
                out[key.strip()] = read_yaml(value)
        except (yaml.YAMLError, ValueError):  # ValueError: a scalar read as a date or number that is none (2026-13-45)
            raise UserError(f"{option} {item!r}: the value is not valid YAML") from None
    return out


WHERE_DATA_IS = ("data.root", "data.download")


def _name(grid: str, o: dict[str, Any], seed: int, extra: dict[str, Any]) -> str:
    """The experiment's name. A paper grid's run is named by its settings only, not by the grid, so
    a run two tables share (table 1's and table 2's CIFAR-100 PBR at buffer 500; table 5's cosine
    PBR and table 2's PBR) is one experiment: the second sweep finds it and queues nothing."""
    if "_row" in o:  # a fidelity cell names itself
        parts = [grid[:3], o["_row"], f"s{seed}"]
    else:
        from pbr.methods import METHODS

        name, buffer = o["method.name"], o.get("method.buffer_size")
        parts = [SHORT[o["data.dataset"]], name]
        if o.get("_variant") is not None:
            parts.append(o["_variant"])
        own_head, _ = METHODS[name].resolve("head", "auto", o["data.dataset"], buffer or 0)
        if o.get("model.head", "auto") not in ("auto", own_head):
            parts.append(o["model.head"])
        if buffer is not None:
            parts.append(f"b{buffer}")
        parts += [o["data.setting"][:3], f"ir{o['data.imbalance_ratio']:g}", f"s{seed}"]
    # The same row under other settings is another experiment; where this machine finds the data is not.
    named = {k: v for k, v in extra.items() if k not in WHERE_DATA_IS}
    if named:
        parts.append(hashlib.sha256(repr(sorted(named.items())).encode()).hexdigest()[:6])
    return "-".join(parts)


MAX_SEEDS = 10_000


def parse_seeds(text: str) -> list[int]:
    """`--seeds`: N (seeds 0..N-1), A-B (A..B, both included) or a list A,B,C."""
    t = text.strip()
    try:
        if "-" in t:
            a, b = (int(x) for x in t.split("-", 1))
            listed = None
        elif "," in t:
            listed = [int(x) for x in t.split(",")]
            a, b = min(listed), max(listed)
        else:
            a, b, listed = 0, int(t) - 1, None
    except ValueError:
        a, b, listed = 0, -1, None
    # A seed is below 2**32 (params.yaml's rule); more than MAX_SEEDS a cell is a typo, not a sweep
    # (and its list would fill the memory before anything said so).
    if b >= 2**32 or (len(listed) if listed is not None else b - a + 1) > MAX_SEEDS:
        raise UserError(f"--seeds {text}: at most {MAX_SEEDS} seeds a cell, each below 2**32")
    seeds = listed if listed is not None else list(range(a, b + 1))
    if not seeds or min(seeds) < 0 or len(set(seeds)) != len(seeds):
        raise UserError(f"--seeds {text}: give N (seeds 0..N-1, N >= 1), a range A-B with A <= B, or a list "
                        "A,B,C of distinct seeds >= 0")
    return seeds


def plan(grid: str, seeds: int | list[int], extra: dict[str, Any], only: dict[str, Any], params_file: Path,
         budget: str = "full") -> list[Run]:
    """The runs of `grid` over `seeds` (a count N: seeds 0..N-1), at `budget`, with `extra` set on
    every run (it wins over the grid and the budget) and only the runs whose values match `only`;
    each run's params are validated."""
    from stages.runtime.config import ConfigError, from_dict

    # Hydra's spellings of a key to add (`-S ++method.mine.gamma=0.5`, as `dvc exp run` takes a key
    # params.yaml lacks): the same key here; the sweep writes `++` itself where DVC needs it.
    extra = {re.sub(r"^\+\+?", "", k): v for k, v in extra.items()}
    if grid not in GRIDS:
        raise UserError(f"sweep {grid!r} is not a grid; use one of {' | '.join(GRIDS)}")
    if budget not in BUDGETS:
        raise UserError(f"--budget {budget}: not one of {' | '.join(BUDGETS)}")
    if "seed" in extra:  # each run's seed is the sweep's to set: -S seed would be overridden, run after run
        raise UserError(f"-S seed={extra['seed']}: a sweep gives each run its seed; use --seeds (N for 0..N-1, "
                        "A-B, or A,B,C)")
    if "seed" in only:  # the grid's cells have no seed yet: it would be params.yaml's, for every run
        raise UserError(f"--only seed={','.join(map(str, only['seed']))}: a sweep's seeds are --seeds (N for 0..N-1, "
                        "A-B, or A,B,C)")
    settings = {**BUDGETS[budget], **extra}
    if isinstance(seeds, int):
        if seeds < 1:
            raise UserError(f"--seeds {seeds}: give at least 1 (seeds 0..N-1 are run)")
        seeds = list(range(seeds))
    base = read_params(params_file) if params_file.is_file() or params_file.is_dir() else None
    if not isinstance(base, dict):
        raise UserError(f"{params_file}: no parameters file here; run pbr sweep in the project's root")
    filters = {k: v if isinstance(v, list) else [v] for k, v in only.items()}
    cells = [(cell, {k: v for k, v in {**cell, **settings}.items() if not k.startswith("_")})
             for cell in GRIDS[grid](base)]
    # `row` picks a fidelity cell by its name (fid-ROW-sSEED): --only row=pbr,pbr-random
    has = {k: [cell.get("_row") if k == "row" else _lookup(base, o, k) for cell, o in cells] for k in filters}
    picked = [(cell, o) for i, (cell, o) in enumerate(cells)
              if all((str(has[k][i]) if k == "row" else has[k][i]) in vals for k, vals in filters.items())]
    _refuse_unmatched(grid, filters, has)
    _refuse_grid_keys(grid, [cell for cell, _ in picked], extra)
    if budget == "proxy":
        _refuse_off_the_proxy(grid, picked, base, extra, params_file, seeds[0])
    runs = []
    for cell, o in picked:
        for seed in seeds:
            overrides = {**o, "seed": seed}
            try:
                from_dict(_merged(base, overrides))
            except ConfigError as e:
                raise UserError(f"sweep {grid}: {e}") from None
            name = _name(grid, cell, seed, extra)
            runs.append(Run(name if budget == "full" else f"{name}-{budget}", overrides,
                            expected_cost(from_dict(_merged(base, overrides))), cell.get("_row"),
                            frozenset(k for k in overrides if not _has(base, k))))
    if not runs:
        wanted = " ".join(f"{k}={','.join(map(str, v))}" for k, v in filters.items())
        raise UserError(f"--only {wanted}: no run of {grid} matches; see `pbr sweep {grid} --dry-run`")
    return runs


def reserved_seeds_warning(grid: str, runs: list[Run], budget: str) -> str | None:
    """One line when runs of cells that are none of a confirmation's rows use its seeds (or the next
    confirmation's, docs/preregistration.md): a result on them that guides a choice spends them. A
    warning, not a refusal: the plans' own rows are run so, and a user may run another plan."""
    from stages.experiments.confirmation import reserved_blocks
    from stages.experiments.report import seed_text

    blocks = reserved_blocks()
    off = [r for r in runs for block, plans in blocks.items() if str(r.overrides.get("seed")) in block and not any(
        grid == "fidelity" and budget == p.budget and r.row in p.rows.values() for p in plans)]
    if not off:
        return None
    return (f"{len(off)} of the {len(runs)} runs use seeds {seed_text(r.overrides['seed'] for r in off)}, kept for "
            "pre-registered confirmations (docs/preregistration.md), in cells that are none of their rows: a "
            "choice made on them spends those seeds (choices use the selection seeds 0-9)")


def _refuse_unmatched(grid: str, filters: dict[str, list], has: dict[str, list]) -> None:
    """An --only value no run of the grid has (a typo: row=pbr-reservior, method.name=dre++) would
    leave its runs out of the plan while the others are queued: one line naming each such value and
    what the grid has. Values compare as the filter compares them (0.01 read from --only is 0.01)."""
    wrong = []
    for key, vals in filters.items():
        grid_values = [str(v) for v in has[key] if v is not None] if key == "row" else has[key]
        missing = [v for v in vals if v not in grid_values]
        if missing and not grid_values:
            wrong.append(f"--only row: {grid} names no rows (fidelity does); pick its runs by their keys")
        elif missing:
            shown = ", ".join(dict.fromkeys(map(str, grid_values)))
            what = "rows" if key == "row" else f"values of {key}"
            wrong.append(f"--only {key}={','.join(map(str, missing))}: no run of {grid} has it ({what}: {shown})")
    if wrong:
        raise UserError("; ".join(wrong))


def _refuse_off_the_proxy(grid: str, picked: list, base: dict, extra: dict[str, Any], params_file: Path,
                          seed: int) -> None:
    """--budget proxy was validated on one stream (PROXY_STREAM): a grid's cell on another (table3's
    shuffled CIFAR-100, families' IR 1, where its per-task epochs fit no task sizes) would run, and be
    reported as "(proxy)", at a budget no one checked there. A stream key given with -S is the user's
    own departure (docs/method.md's shuffled proxy runs), and so is -S train.epochs (the report then
    names the run by its width and epochs, not as the proxy)."""
    if "train.epochs" in extra:
        return
    bad = []  # (cell, its stream keys off PROXY_STREAM -> their values)
    for cell, o in picked:
        now = {k: _lookup(base, o, k, params_file) for k in PROXY_STREAM if k not in extra}
        if wrong := {k: v for k, v in now.items() if v != PROXY_STREAM[k]}:
            bad.append((cell, wrong))
    if not bad:
        return
    off: dict[str, dict[str, None]] = {}
    for _, wrong in bad:
        for k, v in wrong.items():
            off.setdefault(k, {})[str(v)] = None
    values = "; ".join(f"{k}={','.join(vs)}" for k, vs in off.items())
    keep = []  # the --only keys that leave the validated cells: each one some cell the others keep is off in
    for k in PROXY_STREAM:
        if any(k in wrong and not set(wrong) & set(keep) for _, wrong in bad):
            keep.append(k)
    hint = (f", or keep the validated ones: --only {' --only '.join(f'{k}={PROXY_STREAM[k]}' for k in keep)}"
            if len(bad) < len(picked) else "")
    raise UserError(f"--budget proxy was validated on Seq-CIFAR-10-LT only (ordered, IR 0.01, 5 tasks; docs/method.md); "
                    f"{len(bad)} of the {len(picked)} cells of {grid} are off it ({values}; e.g. "
                    f"{_name(grid, bad[0][0], seed, extra)}-proxy): use --budget full{hint}")


def _refuse_grid_keys(grid: str, cells: list[dict[str, Any]], extra: dict[str, Any]) -> None:
    """-S on a key the picked runs of the grid set run by run (table5's heads, table2's buffers, the
    fidelity rows' readings) would give those runs one value under names that say otherwise, several
    names for one run. --only picks the grid's runs by such a key."""
    missing = object()
    for key in extra:
        values = {repr(c.get(key, missing)) for c in cells}
        if len(values) > 1:
            shown = sorted({str(c[key]) for c in cells if key in c})
            rest = "; other runs as params.yaml has it" if any(key not in c for c in cells) else ""
            raise UserError(f"-S {key}: {grid} sets it run by run ({', '.join(shown[:4])}{', ...' * (len(shown) > 4)}"
                            f"{rest}); pick those runs with --only {key}=VALUE, or sweep another grid")


# The largest class of each training set, and its images' pixels relative to CIFAR's 32 x 32.
N_MAX = {k: d.n_max for k, d in FACTS.items()}
PIXELS = {k: (d.side / 32) ** 2 for k, d in FACTS.items()}


def expected_cost(cfg) -> float:
    """A run's expected training cost in CIFAR-sized, width-64 image steps: the images each task
    trains on times its epochs, times the pixels per image and the width squared (a conv's work),
    doubled for a method that replays a memory batch beside every current batch."""
    from pbr.data.longtail import class_counts
    from pbr.methods import METHODS

    counts = class_counts(N_MAX[cfg.data.dataset], cfg.n_classes, cfg.data.imbalance_ratio)
    per_task = counts.reshape(cfg.data.n_tasks, -1).sum(axis=1)  # the ordered cut; a shuffled one is alike
    images = sum(int(n) * cfg.epochs_of(k) for k, n in enumerate(per_task))
    replay = 2.0 if METHODS[cfg.method.name].uses_buffer and cfg.method.buffer_size > 0 else 1.0
    return images * PIXELS[cfg.data.dataset] * (cfg.model.width / 64) ** 2 * replay


def parse_shard(text: str) -> tuple[int, int]:
    k, sep, n = text.partition("/")
    if sep and k.strip().isdigit() and n.strip().isdigit() and 1 <= int(k) <= int(n):
        return int(k), int(n)
    raise UserError(f"--shard {text}: write it as K/N with 1 <= K <= N, e.g. --shard 2/3 for the second of three")


def shard(runs: list[Run], k: int, n: int) -> list[Run]:
    """The K-th of N shards (1-based): the runs dealt, costliest first, each to the shard with the
    least expected cost so far (ties: the lower shard). Every machine computing the same plan gets
    the same split, and the N shards together are the plan, each run in exactly one."""
    load = [0.0] * n
    mine = set()
    for r in sorted(runs, key=lambda r: (-r.cost, r.name)):
        j = min(range(n), key=lambda i: (load[i], i))
        load[j] += r.cost
        if j == k - 1:
            mine.add(r.name)
    return [r for r in runs if r.name in mine]


# Runs at once on one GPU. Without MPS four processes of the ER step saturate it (1.7x one
# process's images/s on an H200) and more add nothing; under MPS eight reach 1.76x four without it
# on an H100, and twelve or sixteen no more than eight (docs/gpu.md, Measured on an H100).
GPU_JOBS = 4
MPS_JOBS = 8


def parse_jobs(text: str) -> int | str:
    t = text.strip().lower()
    if t == "auto":
        return t
    if t.isdigit():
        return int(t)
    raise UserError(f"--jobs {text}: give a number of runs at once (0 or more) or auto")


def on_gpu(runs: list[Run], params_file: Path, cuda_devices: int | None = None) -> bool:
    """Whether the runs train on a CUDA GPU: a run's `train.device` is cuda, or auto on a machine
    that has one."""
    base = read_params(params_file)
    devices = [str(_lookup(base, r.overrides, "train.device", params_file)) for r in runs]
    if all(d == "cpu" for d in devices):
        return False
    if any(d == "cuda" for d in devices):
        return True
    if cuda_devices is None:
        import torch

        cuda_devices = torch.cuda.device_count()
    return cuda_devices > 0


def auto_jobs(runs: list[Run], params_file: Path, gpu: bool, mps: bool = False,
              cores: int | None = None) -> tuple[int, str]:
    """`--jobs auto`: how many runs at once, and why. On a GPU the count measured best (with or
    without MPS); on a CPU one run per `train.threads` cores (one per core when threads are auto:
    each run then takes one, or OMP_NUM_THREADS where that is set)."""
    if gpu:
        if mps:
            return MPS_JOBS, f"{MPS_JOBS} runs at once sharing one GPU through MPS, the count measured best (docs/gpu.md)"
        return GPU_JOBS, f"{GPU_JOBS} runs at once, the count that saturates one GPU without MPS (docs/benchmarks.md)"
    from stages.runtime.threads import available_cores, of_a_run

    if cores is None:
        cores = available_cores()
    base = read_params(params_file)
    threads = max((of_a_run(_lookup(base, r.overrides, "train.threads", params_file)) for r in runs), default=1)
    n = max(1, cores // threads)
    return n, f"{n} run(s) at once: {cores} CPU core(s), {threads} torch thread(s) a run"


def _lookup(base: dict, overrides: dict[str, Any], key: str, params_file: Path | None = None) -> Any:
    """A run's value of `key` (an --only key, or with `params_file` one the sweep itself reads)."""
    if key in overrides:
        return overrides[key]
    d: Any = base
    for part in key.split("."):
        if not isinstance(d, dict) or part not in d:
            if params_file is not None:
                raise UserError(f"{params_file}: no {key} in it; copy it from the project's params.yaml, which "
                                "has every key")
            raise UserError(f"--only {key}: no such parameter in params.yaml")
        d = d[part]
    return d


def _has(base: dict, key: str) -> bool:
    """Whether params.yaml spells out the dotted `key`."""
    d: Any = base
    for part in key.split("."):
        if not isinstance(d, dict) or part not in d:
            return False
        d = d[part]
    return True


def _merged(base: dict, overrides: dict[str, Any]) -> dict:
    import copy

    out = copy.deepcopy(base)
    for key, value in overrides.items():
        d = out
        *heads, last = key.split(".")
        for h in heads:
            d = d.setdefault(h, {})
            if not isinstance(d, dict):
                raise UserError(f"-S {key}: {h} is not a section of params.yaml")
        d[last] = value
    return out


def existing(repo, log=print) -> set[str]:
    """Names of experiments finished for the current commit, queued or running now. A task DVC
    lists as running while no queue worker is alive (its worker was killed: a lost node, a SLURM
    time limit) never finishes: it is marked failed, so that the sweep queues it again."""
    names = {name for runs in repo.experiments.ls().values() for name, _ in runs if name}
    q = repo.experiments.celery_queue
    for task in q.status():
        if task.get("status") == "Queued" and task.get("name"):
            names.add(task["name"])
    try:
        running = list(q._iter_active_tasks())  # (celery result, queue entry) of each unfinished task
    except AttributeError:  # a DVC without it (private API): trust its listing, as before
        return names | {t["name"] for t in q.status() if t.get("status") == "Running" and t.get("name")}
    if running:
        # Every worker answers within the timeout while it lives (its control thread is apart from
        # the run it executes); no answer at all means no worker.
        workers = q.celery.control.inspect(timeout=5.0).active() or {}
        for task in running:
            name = task.entry.name or task.entry.stash_rev[:7]
            if workers:
                names.add(name)
            else:
                q.celery.backend.mark_as_failure(task.async_result.id, None)
                log(f"{name}: listed as running, but no queue worker is alive (killed?): marked failed, queued again")
    return names


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix.rstrip("."): d}
    return {k: v for key, sub in d.items() for k, v in _flat(sub, f"{prefix}{key}.").items()}


def refuse_edited_params(params_file: Path) -> None:
    """A sweep names its runs by the commit, the grid and its -S values, and skips a name that
    finished: params.yaml edited since the commit (a quick run's -S values, which DVC leaves there)
    would go into every run under those names, and a later full sweep would skip them as finished.
    One line naming the keys; outside a git checkout, or where only the data's location differs, the
    sweep goes on."""
    import subprocess

    from stages.runtime.config import NOT_CONTENT  # where the data lies: no part of a run's settings

    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=params_file.parent, capture_output=True,
                             text=True, timeout=20)
        if top.returncode != 0:
            return
        rel = params_file.resolve().relative_to(Path(top.stdout.strip()).resolve()).as_posix()
        head = subprocess.run(["git", "show", f"HEAD:{rel}"], cwd=params_file.parent, capture_output=True, text=True,
                              timeout=20)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return
    if head.returncode != 0:  # not committed yet: nothing to differ from
        return
    then, now = _flat(read_yaml(head.stdout) or {}), _flat(read_params(params_file) or {})
    local = {f"data.{k}" for k in NOT_CONTENT}
    edited = sorted(k for k in then.keys() | now.keys() if k not in local and then.get(k) != now.get(k))
    if edited:
        keys = ", ".join(edited[:4]) + (", ..." if len(edited) > 4 else "")
        raise UserError(f"{params_file} differs from the commit in {keys} (say, a quick run's -S values): every run "
                        "would take them under the grid's names, and a later sweep would skip those runs as finished; "
                        "`git checkout params.yaml` (or commit the change, or give it with -S) first")


def refuse_missing_data(runs: list[Run], params_file: Path) -> None:
    """Queued runs prepare their data in the queue, each on its own: data that is not at data.root,
    with data.download false, failed every run there, one by one. Said once, before queueing."""
    from pbr.data.sources import raw_present
    from stages.runtime.paths import from_repo

    base = read_params(params_file)
    seen = set()
    for r in runs:
        ds, root, fetch = (_lookup(base, r.overrides, k, params_file) for k in ("data.dataset", "data.root", "data.download"))
        if (ds, root, fetch) in seen:
            continue
        seen.add((ds, root, fetch))
        if not fetch and not raw_present(ds, from_repo(root)):
            raise UserError(f"data.root = {root}: no {ds} data there and data.download is false, so every queued "
                            f"run of {ds} (e.g. {r.name}) would fail; put the archive there, or allow the download")


def queue(runs: list[Run], log=print, before=None) -> tuple[int, int]:
    """Queue the runs that are not finished or queued already; returns (queued, skipped).
    `before` is called once the repository is open, before the first run is queued."""
    from dvc.exceptions import DvcException
    from dvc.repo import Repo

    queued = skipped = 0
    try:
        with Repo(".") as repo:
            have = existing(repo, log)
            if before is not None:
                before()
            for r in runs:
                if r.name in have:
                    skipped += 1
                    continue
                try:
                    repo.experiments.run(queue=True, name=r.name, params=r.set_params())
                except Exception as e:  # Hydra's parser on a -S value (a 90-line traceback), or any other
                    done = f" ({queued} queued before it)" if queued else ""
                    why = (str(e).strip().splitlines() or [""])[0]
                    raise UserError(f"dvc could not queue {r.name}{done}: {type(e).__name__}: {why} (its -S values: "
                                    "pbr sweep --dry-run)") from None
                queued += 1
                log(f"queued {r.name}")
    except DvcException as e:
        done = f" ({queued} queued before it)" if queued else ""
        raise UserError(f"dvc could not queue the sweep{done}: {e}; run pbr sweep in the project's root") from None
    return queued, skipped
