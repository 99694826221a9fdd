"""Where each stage reads and writes, relative to the project root (DVC declares the same paths)."""

from pathlib import Path

PARAMS = Path("params.yaml")
PREPARED = Path("data/prepared")
REPORTS = Path("reports")
PREPARE_PLOTS = REPORTS / "prepare"
TRAIN = Path("artifacts/train")
SCORE = Path("artifacts/score")
SCORE_REPORTS = REPORTS / "score"
EVAL = REPORTS / "eval"
METRICS = REPORTS / "metrics.json"
DVC_LOCK = Path("dvc.lock")


def anchor(cwd: Path | None = None) -> Path:
    """The repository root, also from inside a DVC experiment's temporary workspace.

    `dvc exp run --queue` executes each experiment in a copy under `<repo>/.dvc/tmp/exps/`,
    which holds only git-tracked files: the raw data and the MLflow store live at `<repo>`.
    """
    p = (cwd or Path.cwd()).resolve()
    parts = p.parts
    for i in range(len(parts) - 3):
        if parts[i:i + 3] == (".dvc", "tmp", "exps"):
            return Path(*parts[:i])
    return p


def from_repo(path: str | Path, cwd: Path | None = None) -> Path:
    """A user path from params.yaml: relative ones are relative to the repository root."""
    path = Path(path).expanduser()
    return path if path.is_absolute() else anchor(cwd) / path
