"""The lists the docs keep by hand (the checklist's step 6, docs/architecture.md) against the
registry and the grids: a method added tells its author each place that still lacks it."""

import re

import pytest

from conftest import ROOT
from pbr.methods import METHODS
from stages.experiments import sweep
from stages.experiments.paper_results import PAPER_RESULTS

README = (ROOT / "README.md").read_text()
ARCHITECTURE = (ROOT / "docs/architecture.md").read_text()
PARAMS = (ROOT / "params.yaml").read_text()
NUMBERS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
           "sixteen seventeen eighteen nineteen twenty twenty-one twenty-two twenty-three twenty-four").split()


def _cells(text: str, start: str) -> list[str]:
    """The cells of the table row (one line) that begins with `start` (`\\|` inside a cell is no border)."""
    rows = [line for line in text.splitlines() if line.startswith(start)]
    assert len(rows) == 1, f"no single row starting {start!r}"
    return re.split(r"(?<!\\)\|", rows[0])[1:-1]


def _names(label: str) -> str:
    """A label as the docs' prose writes it: "PRS (label counts)" is PRS."""
    return label.split(" (")[0]


def _says(text: str, label: str) -> bool:
    """`label` as a whole name: ER is not DER's or ER-ACE's, A-GEM not A-GEM-R's."""
    return re.search(rf"(?<![\w+-]){re.escape(label)}(?![\w+-])", text) is not None


def _runs(grid: str, seeds: int = 1) -> list:
    return sweep.plan(grid, seeds, {}, {}, ROOT / "params.yaml")


@pytest.mark.parametrize("doc", ["README.md", "docs/architecture.md"])
def test_the_key_tables_list_every_method_name_in_registry_order(doc):
    listed = re.findall(r"`(\w+)`", _cells((ROOT / doc).read_text(), "| `method.name` |")[1])
    assert listed == list(METHODS), f"{doc}: the method.name row should list {' | '.join(METHODS)}"


def test_params_yaml_names_every_method_and_each_reservoir_reader():
    name = re.search(r"^  name: \w+ +# (.*)$", PARAMS, re.M).group(1)
    assert name.split(" | ") == list(METHODS), "params.yaml: method.name's comment should list every method"
    comment = re.search(r"^  reservoir: \w+ +# (.*)$", PARAMS, re.M).group(1)
    readers = [n for n, cls in METHODS.items() if "reservoir" in cls.setting_keys()]
    assert [n for n in readers if not _says(comment, n)] == [], "params.yaml: add these to method.reservoir's comment"


def test_the_readme_has_a_row_per_method_and_counts_the_papers():
    assert [n for n in METHODS if not re.search(rf"^\| `{n}`[ |]", README, re.M)] == [], "README: a Methods row each"
    in_paper = {key[3] for key in PAPER_RESULTS}
    ours = next(cls for cls in METHODS.values() if cls.role == "ours")
    compared = [cls for cls in METHODS.values() if cls.label in in_paper and cls is not ours]
    opening = " ".join(README.split("\n\n")[1].split())
    assert f"the {NUMBERS[len(compared)]} methods it is compared with" in opening, "README's first paragraph"
    others = [_names(cls.label) for cls in METHODS.values() if cls.label not in in_paper and cls is not ours]
    assert [label for label in others if not _says(opening, label)] == [], "README's first paragraph: name them"


def test_the_readme_grid_table_counts_the_runs_and_names_table2s_methods():
    for grid in sweep.GRIDS:
        count = int(re.match(r"\d+", _cells(README, f"| `{grid}` |")[1].strip()).group())
        assert count == len(_runs(grid)), f"README's sweep table: {grid}'s runs per seed (pbr sweep {grid} --dry-run)"
    table2 = _cells(README, "| `table2` |")[2]
    in_table2 = {r.overrides["method.name"] for r in _runs("table2")}
    assert [n for n in in_table2 if not _says(table2, _names(METHODS[n].label))] == [], "README's table2 row: name them"


def test_the_shard_example_is_table2s_split():
    runs = _runs("table2", 5)
    said = re.search(r"table2's (\d+) runs split\s+(\d+) / (\d+) / (\d+)", ARCHITECTURE)
    assert [int(x) for x in said.groups()] == [len(runs), *(len(sweep.shard(runs, k, 3)) for k in (1, 2, 3))], \
        "docs/architecture.md's --shard example: pbr sweep table2 --seeds 5 --shard K/3 --dry-run"


def test_the_memory_policy_table_and_reservoir_row_name_each_method():
    missing = [n for n, cls in METHODS.items()
               if cls.memory is not None and not _says(_cells(ARCHITECTURE, f"| `{cls.memory.__name__}` ")[4],
                                                       _names(cls.label))]
    assert missing == [], "docs/architecture.md's memory-policy table: add each to its policy's row"
    row = _cells(ARCHITECTURE, "| `method.reservoir` |")[2]
    readers = [n for n, cls in METHODS.items() if "reservoir" in cls.setting_keys()]
    assert [n for n in readers if not _says(row, _names(METHODS[n].label))] == [], \
        "docs/architecture.md's method.reservoir row: add them"
