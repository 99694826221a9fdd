"""The layers import one way (docs/architecture.md): pbr/ knows nothing of the stages, MLflow or
params.yaml; in stages/, runtime imports neither pipeline nor experiments, and those two never
import each other. Read from the source (imports inside functions included), so a shortcut taken
in a late edit fails here rather than in a reader's head."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def _room(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "stages" and len(parts) > 1 and parts[1] in ("runtime", "pipeline", "experiments"):
        return f"stages.{parts[1]}"
    return parts[0] if parts[0] in ("stages", "pbr", "mlflow", "yaml", "dvc", "typer") else None


FORBIDDEN = {
    "pbr": {"stages", "stages.runtime", "stages.pipeline", "stages.experiments", "mlflow", "yaml", "dvc", "typer"},
    "stages.runtime": {"stages.pipeline", "stages.experiments"},
    "stages.pipeline": {"stages.experiments"},
    "stages.experiments": {"stages.pipeline"},
}


def test_imports_run_one_way():
    broken = []
    for room, banned in FORBIDDEN.items():
        folder = ROOT.joinpath(*room.split("."))
        for f in sorted(folder.rglob("*.py")):
            for m in sorted(_imports(f)):
                if _room(m) in banned:
                    broken.append(f"{f.relative_to(ROOT)} imports {m}")
    assert not broken, "\n".join(broken)


def test_every_import_of_our_own_modules_names_what_they_hold():
    """Most imports run inside functions (so `pbr --help` stays instant): one of a name moved to
    another module fails only when that path runs (the GPU benchmark's, once, on the GPU)."""
    import importlib

    missing = []
    files = [f for d in ("pbr", "stages", "benchmarks", "tests") for f in sorted(ROOT.joinpath(d).rglob("*.py"))]
    for f in files:
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module \
                    and node.module.split(".")[0] in ("pbr", "stages"):
                module = importlib.import_module(node.module)
                for a in node.names:
                    if a.name != "*" and not hasattr(module, a.name):
                        try:
                            importlib.import_module(f"{node.module}.{a.name}")
                        except ImportError:
                            missing.append(f"{f.relative_to(ROOT)}:{node.lineno} from {node.module} import {a.name}")
    assert not missing, "\n".join(missing)


def test_pbr_runs_the_code_of_the_folder_it_runs_in(tmp_path):
    """A queued or --temp DVC experiment runs its stages in a copy under .dvc/tmp/exps/; the `pbr`
    script imported the installed checkout's code instead, so dvc.lock and the run's code hash named
    code that did not run. A copy's own `stages` must be the one imported (marked here)."""
    import subprocess

    from project import BIN, env, make_project

    ws = make_project(tmp_path / ".dvc" / "tmp" / "exps" / "abc")
    marker = tmp_path / "imported"
    with open(ws / "stages" / "__init__.py", "a") as f:
        f.write(f"\nopen({str(marker)!r}, 'w').write(__file__)\n")
    r = subprocess.run([str(BIN / "pbr"), "--help"], cwd=ws, env=env(), capture_output=True, text=True)
    assert r.returncode == 0 and "Commands" in r.stdout and "Usage: pbr " in r.stdout, r.stderr
    assert marker.read_text() == str(ws / "stages" / "__init__.py")
    # Under PYTHONSAFEPATH the folder cannot be put first: the installed code runs, once, no loop.
    marker.unlink()
    r = subprocess.run([str(BIN / "pbr"), "--help"], cwd=ws, env={**env(), "PYTHONSAFEPATH": "1"},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "Commands" in r.stdout and not marker.exists(), r.stderr
