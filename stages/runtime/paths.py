"""Where each stage reads and writes, relative to the project root (DVC declares the same paths)."""

import hashlib
from pathlib import Path

PREPARED = Path("data/prepared")
REPORTS = Path("reports")
PREPARE_PLOTS = REPORTS / "prepare"
TRAIN = Path("artifacts/train")
SCORE = Path("artifacts/score")
SCORE_REPORTS = REPORTS / "score"
EVAL = REPORTS / "eval"
METRICS = REPORTS / "metrics.json"
DVC_LOCK = Path("dvc.lock")

# The code that shapes the trained weights: the train stage's DVC deps (besides the prepared data)
# and what its resume fingerprint hashes (the resolved settings are hashed as values, so the
# config's own code is not in).
TRAIN_CODE = ("pbr/methods", "pbr/memory", "pbr/models", "pbr/buffer.py", "pbr/selection.py", "pbr/rng.py", "pbr/loop.py",
              "pbr/uncertainty.py", "pbr/data/augment.py", "pbr/data/facts.py", "pbr/data/shards.py", "stages/pipeline/train.py",
              "stages/pipeline/trained.py", "stages/runtime/run_settings.py", "stages/runtime/hardware.py")
# The code that shapes a scoring's numbers: the score stage's DVC deps (besides its inputs and the
# plots' module) and what its resume fingerprint hashes.
SCORE_CODE = ("pbr/uncertainty.py", "pbr/methods", "pbr/memory", "pbr/models", "pbr/data/augment.py", "pbr/data/facts.py",
              "pbr/data/shards.py", "pbr/rng.py", "stages/pipeline/trained.py", "stages/runtime/run_settings.py",
              "stages/pipeline/score.py")
# How params.yaml is read and its `auto` values resolved: a DVC dep of both, so an edit reruns them,
# not fingerprinted (the resolved values are), so a rerun whose values did not change resumes.
CONFIG_CODE = ("stages/runtime/config.py", "stages/runtime/yaml12.py")


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


def repo_root(cwd: Path | None = None) -> Path:
    """anchor(cwd), or the nearest folder above it that holds a DVC project (dvc.yaml beside .dvc/):
    a command the user runs from a subfolder (`pbr report` in docs/) reads the repository's MLflow
    store, not a new empty one there."""
    p = anchor(cwd)
    for q in (p, *p.parents):
        if (q / "dvc.yaml").is_file() and (q / ".dvc").is_dir():
            return q
    return p


def from_repo(path: str | Path, cwd: Path | None = None) -> Path:
    """A user path from params.yaml: relative ones are relative to the repository root."""
    path = Path(path).expanduser()
    return path if path.is_absolute() else anchor(cwd) / path


def code_hash(root: Path | None = None, entries: tuple[str, ...] = TRAIN_CODE) -> str:
    """sha256 of the code that shapes the trained weights (TRAIN_CODE, also the train stage's DVC
    deps), or of `entries`: an edit elsewhere (report, metrics, plots) keeps a finished or killed run."""
    root = root or Path(__file__).resolve().parents[2]
    h = hashlib.sha256()
    for entry in entries:
        p = root / entry
        for f in sorted(p.rglob("*.py")) if p.is_dir() else [p]:
            h.update(f.relative_to(root).as_posix().encode())
            h.update(f.read_bytes())
    return h.hexdigest()
