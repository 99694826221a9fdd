import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REAL_CIFAR10 = ROOT.parent / "shared" / "datasets" / "cifar-10-python.tar.gz"
sys.path.insert(0, str(Path(__file__).parent))  # tests/fakedata.py

real_cifar10 = pytest.mark.skipif(
    not REAL_CIFAR10.is_file(),
    reason=f"real CIFAR-10 not found at {REAL_CIFAR10} (only on development and CI machines)",
)


@pytest.fixture(autouse=True)
def _quiet_env(monkeypatch):
    # Keep DVC and MLflow from phoning home or picking up a user's settings.
    monkeypatch.setenv("DVC_NO_ANALYTICS", "1")
    monkeypatch.setenv("DVC_NO_UPDATE_CHECK", "1")


@pytest.fixture(scope="session")
def finished(tmp_path_factory):
    """One complete `dvc repro` (generated CIFAR-10, PBR, width 4, 2 epochs); copy it to change it.

    Tests that use it carry `xdist_group("finished")` so one worker builds it once."""
    from project import finished_project

    return finished_project(tmp_path_factory.mktemp("finished"))
