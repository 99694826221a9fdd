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
