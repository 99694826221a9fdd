"""The `pbr` command: one sub-command per pipeline stage.

Heavy imports (torch, pyarrow, mlflow) happen inside the commands so `pbr --help` stays instant.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from pbr.errors import UserError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Long-tailed continual learning pipeline (PBR and rehearsal baselines).")

@app.callback()
def _root() -> None:
    """Long-tailed continual learning pipeline (PBR and rehearsal baselines)."""


ParamsOpt = typer.Option(Path("params.yaml"), "--params", "-p", help="Parameters file.")


@app.command()
def prepare(params: Path = ParamsOpt) -> None:
    """Build the long-tailed continual dataset into data/prepared/ (parquet shards + manifest)."""
    from stages import prepare as stage
    from stages.config import load_config

    stage.run(load_config(params))


@app.command()
def train(params: Path = ParamsOpt) -> None:
    """Train the tasks in turn; save each task's model, buffer and accuracy row (resumable)."""
    from stages import train as stage
    from stages.config import load_config

    stage.run(load_config(params))


def main() -> None:
    try:
        app()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
