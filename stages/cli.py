"""The `pbr` command: one sub-command per pipeline stage.

Heavy imports (torch, pyarrow, mlflow) happen inside the commands so `pbr --help` stays instant.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
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


def _stage(name: str, params: Path) -> None:
    """Run one pipeline stage inside the pipeline execution's MLflow run."""
    import importlib

    from stages.runtime import tracking
    from stages.runtime.config import load_config
    from stages.runtime.orphan import follow_dvc

    follow_dvc()
    cfg = load_config(params)
    module = importlib.import_module(f"stages.pipeline.{name}")
    # The stage's own refusals of its inputs, before its MLflow run begins: a mistake leaves no
    # FAILED run (nor a store made for it).
    module.check(cfg)
    with tracking.stage_run(name, cfg.flat(), params) as run:
        try:
            module.run(cfg, tracker=run)
        except OSError as e:
            # A write's own error on a full disk names no file (Python's f.write, Arrow's writer): the
            # folder the stage writes is the disk to free.
            if e.filename is None and e.errno in (errno.ENOSPC, errno.EDQUOT):
                from stages.runtime import paths

                writes = {"prepare": paths.PREPARED, "train": paths.TRAIN, "score": paths.SCORE, "evaluate": paths.REPORTS}
                e.filename = str(writes[name])
                e.strerror = f"{os.strerror(e.errno)} (or on the MLflow store's disk, if that is another)"
            raise


@app.command()
def prepare(params: Path = ParamsOpt) -> None:
    """Build the long-tailed continual dataset into data/prepared/ (parquet shards + manifest)."""
    _stage("prepare", params)


@app.command()
def train(params: Path = ParamsOpt) -> None:
    """Train the tasks in turn; save each task's model, buffer and accuracy row (resumable)."""
    _stage("train", params)


@app.command()
def score(params: Path = ParamsOpt) -> None:
    """MC-dropout mutual information, entropy and forgetting of every sample (artifacts/score/)."""
    _stage("score", params)


@app.command()
def evaluate(params: Path = ParamsOpt) -> None:
    """ACC, BWT, forgetting, minority-task accuracy, weight norms, buffer histograms (reports/)."""
    _stage("evaluate", params)


@app.command()
def report(
    metric: str = typer.Option("acc", "--metric", help="Which metric fills the cells: acc | bwt | forgetting."),
    experiment: str = typer.Option(None, "--experiment",
                                   help="MLflow experiment to read (default: $MLFLOW_EXPERIMENT_NAME, else pbr)."),
    csv: Path = typer.Option(None, "--csv", help="CSV to write (one row per table row and dataset; default: reports/report.csv of "
                                                 "the repository)."),
    tracking_uri: str | None = typer.Option(
        None, "--tracking-uri", help="MLflow store (default: $MLFLOW_TRACKING_URI, else sqlite mlflow.db at the repository root)."),
    markdown: Path | None = typer.Option(None, "--markdown", help="Also write the tables to this file."),
    figures: Path = typer.Option(None, "--figures", help="Folder of the figures (one PNG per table; default: "
                                                         "reports/report of the repository)."),
    log: bool = typer.Option(True, "--log/--no-log", help="Log the figures, CSV and tables to MLflow experiment "
                                                          "<experiment>-report (one run per report)."),
    seeds: str | None = typer.Option(None, "--seeds", help="Only the runs of these seeds: N (0..N-1), A-B or A,B,C "
                                                           "(e.g. a confirmation's fresh seeds: 100-109)."),
) -> None:
    """The paper's tables from finished runs in MLflow: mean ± std over seeds, paper numbers beside,
    PBR paired with each row (95% interval); a figure per table (docs/report.md)."""
    from stages.experiments import report as stage
    from stages.experiments.sweep import parse_seeds
    from stages.runtime.tracking import experiment_name

    exp = experiment or experiment_name()
    # The defaults are the repository's, as its MLflow store is, also from a subfolder (docs/).
    csv = csv if csv is not None else _in_repo(Path("reports/report.csv"))
    figures = figures if figures is not None else _in_repo(Path("reports/report"))
    out = stage.run(tracking_uri=tracking_uri, experiment=exp, metric=metric, csv_path=csv,
                    markdown_path=markdown, figures_dir=figures, log_mlflow=log,
                    seeds=None if seeds is None else parse_seeds(seeds))
    typer.echo(out.text, nl=False)
    if out.csv_path is not None:
        typer.echo(f"\nwrote {out.csv_path}" + (f" and {out.markdown_path}" if out.markdown_path else ""),
                   err=True)
    for path in out.figures:
        typer.echo(f"wrote {path}", err=True)
    if out.mlflow_run is not None:
        typer.echo(f"logged to MLflow experiment '{stage.report_experiment(exp)}', run {out.mlflow_run}", err=True)
    for line in out.warnings:
        typer.echo(f"warning: {line}", err=True)


@app.command()
def confirm(
    which: str = typer.Argument("defaults", help="defaults: C1-C5 on seeds 100-109; outliers: C6, the top 5% MI "
                                                 "left out against the default, on seeds 200-209; walkpool: C7, the "
                                                 "walk over buffer and task against the default, on seeds 200-209."),
    experiment: str = typer.Option(None, "--experiment",
                                   help="MLflow experiment to read (default: $MLFLOW_EXPERIMENT_NAME, else pbr)."),
    tracking_uri: str | None = typer.Option(
        None, "--tracking-uri", help="MLflow store (default: $MLFLOW_TRACKING_URI, else sqlite mlflow.db at the repository root)."),
    markdown: Path | None = typer.Option(None, "--markdown", help="Also write the table to this file."),
    missing: list[str] = typer.Option([], "--missing", help="ROW=SEEDS: a row's seeds that cannot be completed (run "
                                      "again, failed again), e.g. pbr-random=103: reported as missing, its "
                                      "comparisons on the seeds both rows have (docs/preregistration.md)."),
) -> None:
    """A pre-registered confirmation (docs/preregistration.md): its comparisons on its seeds, 95%
    intervals, Holm-adjusted p and the verdicts by the page's rule."""
    from stages.experiments import confirmation
    from stages.runtime.tracking import experiment_name

    text = confirmation.run(tracking_uri, experiment or experiment_name(), which, missing)
    typer.echo(text, nl=False)
    if markdown is not None:
        from stages.runtime import artifacts

        artifacts.write_text(markdown, text)


@app.command()
def sweep(
    name: str = typer.Argument(..., help="Grid: table1 (the LTCL methods against PBR, Seq-CIFAR-100-LT), table2 "
                                         "(methods x buffers x datasets), table3 (shuffled, IRs), table5 (ablation), "
                                         "fidelity (PBR's open readings against ER), families (every method, balanced "
                                         "and long-tailed Seq-CIFAR-10)."),
    budget: str = typer.Option("full", "--budget", help="full: params.yaml as it is (50 epochs per task, width "
                                                        "64); proxy: the validated cheap stand-in, Seq-CIFAR-10-LT "
                                                        "(ordered, IR 0.01) cells only (docs/method.md); quick: "
                                                        "width 8, one epoch a task."),
    seeds: str = typer.Option("5", "--seeds", help="N: seeds 0..N-1 of every cell (the paper averages 5 runs); "
                                                     "A-B: seeds A..B (e.g. 100-109); or a list A,B,C."),
    set_: list[str] = typer.Option([], "--set", "-S", help="key=value set on every run, e.g. -S train.epochs=5 "
                                                           "(repeatable)."),
    only: list[str] = typer.Option([], "--only", help="key=v1,v2: keep the runs with these values, e.g. --only "
                                                      "method.name=pbr, or a fidelity row: --only row=pbr,er-lr0.1 (repeatable)."),
    shard_: str = typer.Option("", "--shard", help="K/N: queue only the K-th of N shards of the grid, balanced by "
                                                    "expected cost (one per machine, or a SLURM array task: "
                                                    "sbatch --array=1-N, then --shard $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the dvc commands; queue nothing."),
    jobs_: str = typer.Option("0", "--jobs", "-j", help="Start this many queue workers after queueing (0: don't); "
                                                        "with --offline, runs at a time (0: 1). auto: on a GPU 8 under "
                                                        "MPS (4 without), else one per core."),
    gpu_share: str = typer.Option("auto", "--gpu-share", help="With --offline on a CUDA GPU: auto runs the runs "
                                                              "under a CUDA MPS server of the sweep's own where one "
                                                              "starts; mps insists; off time-slices (docs/gpu.md)."),
    offline: Path | None = typer.Option(None, "--offline", help="Run the grid here and now without DVC or a tracking "
                                                               "server: each run in DIR/runs/NAME, recorded in "
                                                               "DIR/mlflow.db (or plain files: --record); then `pbr "
                                                               "import DIR` (docs/offline.md)."),
    record: str = typer.Option("auto", "--record", help="With --offline: mlflow (DIR/mlflow.db), files (plain files "
                                                        "in DIR/journal, no MLflow needed), or auto: as DIR already "
                                                        "records, else files where MLflow is not installed."),
    params: Path = ParamsOpt,
) -> None:
    """Queue a paper grid as DVC experiments (`dvc exp run --queue`); `pbr report` tabulates them."""
    from stages.experiments import sweep as stage

    from stages.experiments.offline import RECORD

    if record not in RECORD:
        raise UserError(f"--record {record}: give one of {', '.join(RECORD)}")
    if record != "auto" and offline is None:
        raise UserError(f"--record {record}: it says how an --offline sweep records; give --offline DIR too")
    runs = stage.plan(name, stage.parse_seeds(seeds), stage.parse_assignments(set_, "-S"),
                      stage.parse_assignments(only, "--only", many=True), params, budget)
    if offline is None and params.resolve() != Path("params.yaml").resolve():
        # `dvc exp run -S` sets the repository's params.yaml: another file would plan runs that never run.
        raise UserError(f"--params {params}: queued DVC runs take the repository's params.yaml; sweep {params} with "
                        "--offline DIR, or put its values in params.yaml (or give them with -S)")
    jobs = stage.parse_jobs(jobs_)
    from stages.runtime import mps

    share = mps.parse_mode(gpu_share)  # before --dry-run, which takes no other option's mistake either
    if reserved := stage.reserved_seeds_warning(name, runs, budget):
        typer.echo(f"warning: {reserved}", err=True)
    if shard_:
        k, n = stage.parse_shard(shard_)
        total = sum(r.cost for r in runs)
        count = len(runs)
        runs = stage.shard(runs, k, n)
        typer.echo(f"shard {k}/{n}: {len(runs)} of {count} runs, "
                   f"{100 * sum(r.cost for r in runs) / total:.0f}% of the grid's expected cost", err=True)
        if not runs:  # more shards than runs (a SLURM array larger than the grid): nothing to do is no error
            return
    if dry_run:
        if offline is not None:  # no DVC there: each run's folder and what it would set
            typer.echo(f"offline: each run in {offline}/runs/NAME (its params.yaml: params.yaml with these values), "
                       "`pbr train` then `pbr evaluate`; a run that holds DONE is skipped", err=True)
            typer.echo("\n".join(f"{offline / 'runs' / r.name}  {' '.join(r.set_params())}" for r in runs))
        else:
            typer.echo("\n".join(r.command() for r in runs))
        typer.echo(f"{len(runs)} run{'s' * (len(runs) != 1)}", err=True)
        try:  # what the real call would refuse, said now
            stage.refuse_edited_params(params)
        except UserError as e:
            typer.echo(f"warning: the sweep itself would stop here: {e}", err=True)
        return
    stage.refuse_edited_params(params)
    if offline is None and share == "mps":
        raise UserError("--gpu-share mps: MPS serves --offline sweeps only (the sweep starts and stops its "
                        "server); DVC's queue workers outlive the command")
    gpu = stage.on_gpu(runs, params) if offline is not None or jobs == "auto" else False
    from stages.experiments import offline as direct

    # A kill of an offline sweep unwinds (its MPS daemon quits, its runs and prepare stages stop with it).
    with direct.kills_interrupt() if offline is not None else contextlib.nullcontext(), \
            mps.shared(share if offline is not None else "off", gpu, log=lambda m: typer.echo(m, err=True)) as shared:
        if jobs == "auto":
            jobs, why = stage.auto_jobs(runs, params, gpu, shared)
            hint = "; --offline runs 8 under MPS (docs/gpu.md)" if gpu and offline is None else ""
            typer.echo(f"--jobs auto: {why}{hint}", err=True)
        if offline is not None:
            _, _, failed = direct.run_all(runs, offline, params, jobs=max(jobs, 1),
                                          log=lambda m: typer.echo(m, err=True), record=record)
            if failed:
                raise typer.Exit(1)
            return
    from stages.runtime import tracking

    stage.refuse_missing_data(runs, params)
    # The store is created once, before parallel workers open it.
    queued, skipped = stage.queue(runs, log=lambda m: typer.echo(m, err=True), before=tracking.init_store)
    typer.echo(f"{name}: {queued} run{'s' * (queued != 1)} queued, {skipped} already finished or queued; MLflow store "
               f"{tracking.recording_uri()}", err=True)
    if jobs > 0:
        import subprocess
        import time

        from stages.runtime.paths import from_repo

        # DVC's queue daemon and its workers inherit the output of the command that starts them and hold
        # it open until the last run ends: whatever reads this command's output (`pbr sweep | tee`, a
        # script's captured output) would wait for the whole queue. They get a log file instead, kept
        # (DVC's own tmp folder, not tracked) for when a worker misbehaves.
        log = from_repo(".dvc/tmp/pbr-queue.log")
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a+") as said:
            said.write(f"\n$ dvc queue start -j {jobs}   # pbr sweep {name}, {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
            said.flush()
            start = said.tell()
            started = subprocess.run([sys.executable, "-m", "dvc", "queue", "start", "-j", str(jobs)],
                                     stdin=subprocess.DEVNULL, stdout=said, stderr=subprocess.STDOUT)
            said.seek(start)
            lines = [line for line in said.read().splitlines() if line.strip()]
        if started.returncode != 0:
            raise UserError(f"dvc queue start -j {jobs} failed: {lines[-1] if lines else started.returncode}; "
                            "the runs stay queued (dvc queue status), start them with dvc queue start")
        typer.echo("\n".join(lines + [f"follow them with: dvc queue status; then pbr report (the queue's own "
                                        f"output: {log})"]), err=True)
    else:
        typer.echo("run them with: dvc queue start -j 2   (then: dvc queue status; pbr report)", err=True)


@app.command("import")
def import_(
    source: str = typer.Argument(..., help="The folder copied back from an offline machine (mlflow.db and "
                                           "mlartifacts/, or journal/: runs recorded to plain files), a .db file, "
                                           "a journal:FOLDER, or any MLflow tracking URI."),
    tracking_uri: str | None = typer.Option(
        None, "--tracking-uri", help="Store to import into (default: $MLFLOW_TRACKING_URI, else sqlite mlflow.db at the repository root)."),
    experiment: str | None = typer.Option(None, "--experiment", help="Experiment to copy, into the one of the same "
                                                                     "name (default: $MLFLOW_EXPERIMENT_NAME, else pbr)."),
    no_artifacts: bool = typer.Option(False, "--no-artifacts", help="Copy the runs without their artifacts."),
) -> None:
    """Copy the runs recorded elsewhere (`pbr sweep --offline DIR`, mlflow-offline/) into the project's store,
    once each, so `pbr report` counts them (docs/offline.md)."""
    from stages.experiments import sync
    from stages.runtime import tracking

    out = sync.import_runs(source, tracking_uri or tracking.tracking_uri(), experiment or tracking.experiment_name(),
                           with_artifacts=not no_artifacts, log=lambda m: typer.echo(m, err=True),
                           flag=tracking_uri is not None)
    typer.echo(out.summary())


@app.command()
def ui(
    port: int = typer.Option(5000, "--port", min=1, max=65535, help="Port of the local UI (a sqlite store only)."),
    tracking_uri: str | None = typer.Option(
        None, "--tracking-uri", help="MLflow store (default: $MLFLOW_TRACKING_URI, else sqlite mlflow.db at the repository root)."),
) -> None:
    """Print the MLflow UI's link to the training runs and their charts; for a local sqlite store, serve
    the UI too (mlflow ui, until Ctrl-C)."""
    import subprocess

    from stages.runtime import tracking

    uri = tracking_uri or tracking.tracking_uri()
    exp_id = tracking.existing_experiment_id(uri, tracking.experiment_name(), flag=tracking_uri is not None)
    tracking.close_dead_runs(uri, exp_id)
    if uri.startswith(("http://", "https://")):
        typer.echo(tracking.ui_link(uri, exp_id))
        return
    _port_free(port)
    typer.echo(f"open {tracking.ui_link(f'http://127.0.0.1:{port}', exp_id)}   (Ctrl-C ends the UI)", err=True)
    # The server in a session of its own, stopped with SIGTERM whenever this command ends (Ctrl-C, a
    # kill, a closed terminal; SIGKILL through the kernel's parent-death signal): a terminal's Ctrl-C
    # reaching MLflow's workers directly prints a traceback from each.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.default_int_handler)
    warn = ",".join(filter(None, (os.environ.get("PYTHONWARNINGS"), "ignore::DeprecationWarning")))  # MLflow's
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", "127.0.0.1",
                               "--port", str(port)], start_new_session=True, preexec_fn=_ends_with_parent,
                              env={**os.environ, "PYTHONWARNINGS": warn})
    try:
        if server.wait():
            raise UserError(f"MLflow's UI server stopped (exit {server.returncode}); its lines above say why")
    except KeyboardInterrupt:
        _stop(server)
        typer.echo("MLflow UI stopped", err=True)
    finally:
        _stop(server)


def _ends_with_parent() -> None:
    """In the server's process before it starts (Linux): the kernel sends it SIGTERM when pbr ui dies,
    even by SIGKILL."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _stop(server) -> None:
    import subprocess

    if server.poll() is not None:
        return
    os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=30)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):  # stuck, or a second Ctrl-C: no more waiting
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def _port_free(port: int) -> None:
    """MLflow's server exits 0 when its port is taken, after its start-up: asked first, the answer is a line."""
    import socket

    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: a closing port is free
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            raise UserError(f"pbr ui --port {port}: the port is in use (another UI or server); give another "
                            "with --port") from None


INTERRUPTED = ("interrupted: what finished is kept (a stage's finished tasks too); the same command, `dvc repro` "
               "or `dvc exp run` resumes")


def _run_the_workspaces_code() -> None:
    """Re-exec under this interpreter as `python -m stages.cli` where the folder a command runs in
    holds the project's code and it is not the code imported. The `pbr` script imports the package
    from where it was installed (`pip install -e .` in the checkout), so a queued or `--temp` DVC
    experiment, run in its copy under .dvc/tmp/exps/, ran the checkout's code as it was at that
    moment, and dvc.lock and the run's code hash named code that did not run."""
    here = Path.cwd()
    if not ((here / "stages" / "cli.py").is_file() and (here / "pbr").is_dir()):
        return
    try:
        here = here.resolve()
        if Path(__file__).resolve().parents[1] == here or os.environ.get("PBR_REEXEC") == str(here):
            return  # the workspace's code, or it cannot be put first (PYTHONSAFEPATH): no loop
    except OSError:
        return
    os.environ["PBR_REEXEC"] = str(here)  # -m puts this folder first on the path
    os.execv(sys.executable, [sys.executable, "-m", "stages.cli", *sys.argv[1:]])


def main() -> None:
    """The `pbr` script (the name every install's script calls): the workspace's code (above), then
    the command."""
    _run_the_workspaces_code()
    run_command()


def run_command() -> None:
    """The command in this process, whatever code it imported: what tests call in their own process
    (an exec there would replace the test run), and the re-exec's target."""
    # SIGTERM (a SLURM time limit or preemption, `kill`, `timeout`, `docker stop`) and SIGHUP (a closed
    # terminal) stop a command as Ctrl-C does: its MLflow run says KILLED at once, on any machine,
    # rather than RUNNING until a later stage on the same host marks it. Only where the signal has its
    # default action: `nohup` keeps SIGHUP ignored.
    saved = {sig: signal.signal(sig, signal.default_int_handler) for sig in (signal.SIGTERM, signal.SIGHUP)
             if signal.getsignal(sig) == signal.SIG_DFL}
    # MLflow's client prints "View run ... at" for each run a stage (or `pbr report`, closing a dead
    # one) ends on a server: read as if the report had logged something. `pbr ui` prints the link.
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    try:
        _main()
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def _in_repo(rel: Path) -> Path:
    """`rel` in the repository a command runs in (stages.runtime.paths.repo_root): as given from its
    root, absolute from a subfolder."""
    from stages.runtime.paths import repo_root

    root = repo_root()
    return rel if root == Path.cwd().resolve() else root / rel


def _pipeline_file(name) -> bool:
    """A path under the pipeline's outputs (data/, artifacts/, reports/ of the repository)."""
    if not name:
        return False
    # The workspace's root (a queued run's copy under .dvc/tmp/exps has its own dvc.yaml), else here.
    here = Path.cwd().resolve()
    root = next((d for d in (here, *here.parents) if (d / "dvc.yaml").is_file()), here)
    path = Path(os.fsdecode(name))
    path = path if path.is_absolute() else here / path
    try:
        first = path.resolve().relative_to(root).parts[:1]
    except ValueError:
        return False
    return first in (("data",), ("artifacts",), ("reports",))


def _out_of_memory(e: BaseException) -> bool:
    """The host's or a GPU's memory ran out (torch says so in its message; no torch import here)."""
    text = str(e)
    return (isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError"
            or "can't allocate memory" in text or "out of memory" in text.lower())


def _store_unwritable(e: BaseException) -> str | None:
    """What sqlite said where the tracking store could not take a write (a full disk, a read-only
    file), else None: MLflow wraps it in an MlflowException (no mlflow import here)."""
    text = str(e).lower()
    for said in ("database or disk is full", "attempt to write a readonly database", "disk i/o error",
                 "database is locked"):
        if said in text and type(e).__name__ in ("MlflowException", "OperationalError"):
            return said
    return None


def _main() -> None:
    try:
        app(prog_name="pbr")  # re-executed as `python -m stages.cli` (above), help still says `pbr`
    except SystemExit as e:
        if e.code == 130:  # Ctrl-C: typer turns it into a silent exit 130
            print(INTERRUPTED, file=sys.stderr)
        raise
    except UserError as e:
        print("error: " + " ".join(line.strip() for line in str(e).splitlines()), file=sys.stderr)
        sys.exit(2)
    except FileNotFoundError as e:
        if _pipeline_file(e.filename):
            print(f"error: {e.filename} is missing; a pipeline file: `dvc checkout` restores it, `dvc repro` "
                  "rebuilds it", file=sys.stderr)
        else:  # a store, a folder given on the command line: no DVC output, its parent is what is missing
            print(f"error: {e.filename or e}: no such file or folder; check the path (and that its folder "
                  "exists)", file=sys.stderr)
        sys.exit(2)
    except (MemoryError, RuntimeError) as e:  # torch.OutOfMemoryError is a RuntimeError
        if type(e).__name__ == "InductorError":  # torch.compile's kernels could not be built (no C++ compiler, ...)
            why = (str(e).strip().splitlines() or [""])[0]
            print(f"error: train.compile: torch.compile could not build the model ({why}); set train.compile: false "
                  "(what finished is kept, and the same command resumes)", file=sys.stderr)
            sys.exit(2)
        if not _out_of_memory(e):
            raise
        print("error: out of memory while it ran (" + " ".join(str(e).split())[:120] + "); lower train.batch_size, "
              "train.replay_batch_size, train.eval_batch_size or model.width (on a GPU, or wait for the other "
              "processes on it); what finished is kept, and the same command resumes", file=sys.stderr)
        sys.exit(2)
    except OSError as e:  # unwritable output folder, full disk, ...: name the file, no traceback
        where = f"{e.filename}: " if e.filename else ""
        print(f"error: {where}{e.strerror or e}; check that the location is writable and has space",
              file=sys.stderr)
        sys.exit(2)
    except Exception as e:
        why = _store_unwritable(e)
        if why is None:
            raise
        store = os.environ.get("MLFLOW_TRACKING_URI") or "mlflow.db at the repository root"
        fix = ("other processes held its lock past sqlite's 20 s wait (many workers on one file, or a network file "
               "system, whose locks sqlite cannot trust: give the team an MLflow server, docs/team.md)"
               if why == "database is locked" else "free space on its disk (or make it writable)")
        print(f"error: the MLflow store ({store}) could not be written: {why}; {fix}, and run the same command: what "
              "finished is kept, and it resumes", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print(INTERRUPTED, file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    run_command()  # the re-exec's target: the code is this folder's already
