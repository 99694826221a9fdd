"""Where each stage reads and writes, relative to the project root (DVC declares the same paths)."""

from pathlib import Path

PARAMS = Path("params.yaml")
PREPARED = Path("data/prepared")
REPORTS = Path("reports")
PREPARE_PLOTS = REPORTS / "prepare"
TRAIN = Path("artifacts/train")
