"""Whole runs on one GPU, with and without MPS: runs per hour through the training code itself.

    python benchmarks/bench_runs_gpu.py --out $OUT      # random pixels, 10 epochs a task: speed only
    python benchmarks/bench_runs_gpu.py --device cpu --width 4 --small      # a smoke check, about a minute
    # accuracy too: the real Seq-CIFAR-10-LT, prepared here and carried (run's carry: gpu-carry)
    pbr prepare && mkdir -p gpu-carry && XZ_OPT=-T0 tar -cJf gpu-carry/prepared.tar.xz data/prepared  # 51 MB
    python benchmarks/bench_runs_gpu.py --prepared gpu-carry/prepared.tar.xz --epochs 50 \
        --phases mps-graphs --seeds 0-1 --mps-runs 4 --seconds 540 --out $OUT    # docs/gpu.md

bench_routes times the ER step in a loop; this runs what `pbr sweep --offline` runs: each run its
own process running the train then the evaluate stage (`pbr train`, `pbr evaluate`), recorded to
plain files (stages/runtime/journal.py: the GPU machines have no MLflow), on Seq-CIFAR-10-LT,
ordered, IR 0.01, params.yaml's defaults but `--epochs` a task, the fidelity grid's `--rows`
(default PBR and ER at lr 0.1) seed by seed:

  mps   --mps-runs runs at once under an MPS daemon of stages.runtime.mps (what `--jobs auto` does)
  off   --off-runs runs at once time-slicing the GPU, the first seeds of the same rows
  mps-graphs  as mps, with `train.compile: graphs` (the network as CUDA graphs): the combination
              most likely to approach 120 runs an hour (docs/gpu.md)

Each phase runs to completion; its runs/hour is given two ways (`rates`): runs x 3600 / wall
seconds (a lower bound for a sweep, which refills the slots its first runs leave) and runs at once x
3600 / the runs' mean time; each is scaled to the full protocol's 50 epochs a task by x epochs / 50
(an underestimate where the epochs are fewer: a run's start, data loading, evaluation and PBR's
MC-dropout scoring do not shrink with them). The MPS phases run time-slicing where MPS does not
start, the first seed's runs only (all, at the no-MPS pace, might not end within --seconds), and
their rows say so. A seed that ran in both phases must give the same accuracy rows (MPS runs
each process's own kernels); any difference is printed. The data are CIFAR-10's exact format and
size with random pixels (the archive cannot travel to the GPU machine): speed, not accuracy. With
--prepared the runs train on a data set `pbr prepare` wrote (its folder, or a .tar.xz of it: the
real Seq-CIFAR-10-LT is 69 MB, over a call's 64 MiB, and 51 MB packed), and the final Class-IL of
each seed in mps and mps-graphs is compared against the spread of the eager seeds.
Results go to --out as runs_gpu.json and runs_gpu.md, rewritten as each run ends (each run with its
end time); every run's log lines go to --out/runs.log as they come, prefixed with the phase and the
run (its per-task accuracies), so a call cut short, or stopped by SIGTERM (its runs stopped, the MPS
daemon quit), still shows how far its runs came: a device call brings back eight files, and this
writes four. The runs' records
go to --out/journal.tar.gz, repacked as each run ends: `tar -xzf journal.tar.gz && pbr import
journal` makes them runs of the project's store, which `pbr report` shows on rows of their own
("Ran on cuda"). Give the commit the code is at as PBR_GIT_COMMIT where the copy has no .git.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
FULL_EPOCHS = 50
ROWS = ("pbr", "er-lr0.1")


def child(folder: Path) -> None:
    """One run in `folder` (its params.yaml and data/prepared link): what `pbr train` then `pbr evaluate`
    run, recorded where MLFLOW_TRACKING_URI says (the parent sets plain files: journal:)."""
    import signal

    # Stopped (the call's deadline, its SIGTERM): unwind as Ctrl-C, so the run's record says KILLED
    # rather than RUNNING forever, which `pbr import` would wait on.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    os.chdir(folder)
    from stages.pipeline import evaluate, train
    from stages.runtime import tracking
    from stages.runtime.config import load_config

    t0 = time.time()  # each line stamped: a call cut short still tells each task's pace

    def log(m):
        print(f"[{time.time() - t0:6.0f} s] {m}", file=sys.stderr, flush=True)

    cfg, params = load_config("params.yaml"), Path("params.yaml")
    with tracking.stage_run("train", cfg.flat(), params) as run:
        summary = train.run(cfg, log=log, tracker=run)
    with tracking.stage_run("evaluate", cfg.flat(), params) as run:
        evaluate.run(cfg, log=log, tracker=run)
    last = summary["class_il"]["matrix"][-1]
    print(json.dumps({"class_il_rows": summary["class_il"]["matrix"], "class_il": sum(last) / len(last)}), flush=True)


def prepare(base: Path, a) -> dict:
    """The data the runs train on, prepared once under `base` (fake CIFAR-10 in its archive format,
    or --prepared unpacked or linked); returns the params the runs start from."""
    from stages.runtime.yaml12 import read_params

    params = read_params(ROOT / "params.yaml")
    params["model"]["width"] = a.width
    params["train"].update(device=a.device, epochs=a.epochs)
    if a.prepared:
        return {**params, "data": {**params["data"], **carried(a.prepared, base / "data" / "prepared")}}
    sys.path.insert(0, str(ROOT / "tests"))
    import fakedata
    from stages.pipeline import prepare as prep
    from stages.runtime.config import from_dict

    per_class = (200, 6) if a.small else (5000, 1000)
    fakedata.write_cifar(base / "raw", 10, *per_class, mode="w")
    params["data"].update(root=str(base / "raw"), download=False)
    cwd = os.getcwd()
    os.chdir(base)
    try:
        prep.run(from_dict(params), log=lambda m: None)
    finally:
        os.chdir(cwd)
    return params


def _ends_with_parent():
    """The runs' preexec_fn (Linux; else None): the kernel sends a run SIGTERM when this script dies,
    by SIGKILL too (a call's time limit), where its runs went on training as orphans. prctl is looked
    up here, in this process: the forked child of one with threads (CUDA's) calls it only, never a
    dlopen or an import, which could wait for ever on a lock another thread held at the fork."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes
    import signal

    prctl, sig = ctypes.CDLL(None, use_errno=True).prctl, int(signal.SIGTERM)

    def preexec() -> None:
        prctl(1, sig)  # PR_SET_PDEATHSIG

    return preexec


def carried(source: Path, dest: Path) -> dict:
    """`pbr prepare`'s output at `dest`, from its folder or a .tar.xz holding data/prepared; returns the
    data settings it was prepared with (its manifest's), so the runs' params say what they train on."""
    import tarfile

    dest.parent.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        dest.symlink_to(source.resolve())
    else:
        try:
            with tarfile.open(source, "r:*") as tar:  # the "data" filter where this Python has it (3.11.4+)
                tar.extractall(dest.parent.parent, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        except Exception as e:  # noqa: BLE001 (a cut-short archive: EOFError, LZMAError, zlib.error, TarError)
            raise SystemExit(f"--prepared {source}: cannot be unpacked ({type(e).__name__}: "
                             f"{(str(e).splitlines() or [''])[0]}); copy it again, or pack it with "
                             "`tar -cJf gpu-carry/prepared.tar.xz data/prepared`") from None
    manifest = dest / "manifest.json"
    if not manifest.is_file():
        raise SystemExit(f"--prepared {source}: no data/prepared/manifest.json in it (pack it with "
                         f"`tar -cJf gpu-carry/prepared.tar.xz data/prepared` after `pbr prepare`)")
    return {k: v for k, v in json.loads(manifest.read_text())["params"].items() if k not in ("root", "download")}


def carried_refusal(base: Path, params: dict, runs: list) -> str:
    """Why the runs would be refused the prepared data under `base` (the grid's data keys against
    what prepared it, as the train stage checks it), or "": said once, before any phase starts."""
    from pbr.errors import UserError
    from stages.experiments.sweep import _merged
    from stages.runtime.config import refuse_stale
    from stages.runtime.config import from_dict

    manifest = json.loads((base / "data" / "prepared" / "manifest.json").read_text())
    for r in runs:
        try:
            refuse_stale(from_dict(_merged(params, r.overrides)), manifest)
        except UserError as e:
            return f"{r.name}: {e}"
    return ""


CALL_KEYS = ("train.compile", "train.device", "train.epochs", "model.width", "seed")  # the call's options


def settings(pairs: list[str], rows: str, seeds: list[int]) -> dict:
    """--set as {key: value}, values read as YAML (as `dvc exp run -S`), each run's params validated as
    `pbr sweep -S` validates them. Refused, so that what the meta records is what ran: a key the call's
    own options set (--width, --epochs, --device, the phases' compile, the seeds), one a row sets, and
    data.* (the runs train on the prepared data as it is)."""
    from pbr.errors import UserError
    from stages.experiments.sweep import parse_assignments, plan

    try:
        over = parse_assignments(pairs, "--set")
        runs = plan("fidelity", seeds, {}, {"row": rows.split(",")}, ROOT / "params.yaml", "full")
        by_rows = {k for r in runs for k in r.overrides}
        for key in over:
            if key in CALL_KEYS or key.startswith("data.") or key in by_rows:
                raise UserError(f"--set {key}: the call sets it (its options, the rows or the prepared data); "
                                "give it through the call's own options, or leave it")
        plan("fidelity", seeds, over, {"row": rows.split(",")}, ROOT / "params.yaml", "full")  # validates
    except UserError as e:
        raise SystemExit(str(e)) from None
    return over


def pack(journal_dir: Path, out: Path) -> None:
    """The runs' records (plain files, stages/runtime/journal.py) as one archive under `out`, replaced
    whole: a call's files come back only two folders deep, and a call cut short keeps the last one.
    Here: `tar -xzf journal.tar.gz && pbr import journal`."""
    import io
    import tarfile

    if not journal_dir.is_dir():
        return
    tmp = out / ".journal.tar.gz.tmp"
    with tarfile.open(tmp, "w:gz") as tar:
        # Other runs write on meanwhile: each file is read whole once (a JSON file is replaced by a
        # rename, so either version reads complete), its size taken from what was read.
        for f in sorted(journal_dir.rglob("*")):
            if f.name.startswith(".") or not f.is_file():  # one being written under a temporary name
                continue
            try:
                data = f.read_bytes()
            except OSError:  # renamed away since the listing: the next pack has it
                continue
            info = tarfile.TarInfo(f"journal/{f.relative_to(journal_dir).as_posix()}")
            info.size, info.mtime = len(data), int(time.time())
            tar.addfile(info, io.BytesIO(data))
    tmp.replace(out / "journal.tar.gz")


class Relay:
    """The runs' logs as one file under --out (a call brings back eight files at most): each run's
    new lines, prefixed with its name, appended as they come, so a call cut short still shows how
    far every run came."""

    def __init__(self, path: Path):
        self.path, self.read = path, {}
        path.write_text("")  # this call's runs only

    def __call__(self, name: str, log: Path, final: bool = False) -> None:
        """Appends `log`'s new whole lines (`final`: its last line too, with or without a newline);
        a log that cannot be read or written now is tried again on the next call, not the runs' end."""
        try:
            with open(log, "rb") as f:
                f.seek(self.read.get(log, 0))
                data = f.read()
            done = data if final else data[:data.rfind(b"\n") + 1]  # the rest comes with the next call
            if done:
                with open(self.path, "a", encoding="utf-8") as out:
                    out.writelines(f"{name} {line}\n" for line in done.decode(errors="replace").splitlines())
            self.read[log] = self.read.get(log, 0) + len(done)
        except OSError as e:
            print(f"runs.log: {log} not relayed: {e}", flush=True)


STOP_GRACE = 10.0  # seconds the runs of a stopped phase get, all together, to end on SIGTERM


def stop_all(procs) -> None:
    """SIGTERM to every process, then SIGKILL to those still alive after one shared grace period."""
    for p in procs:
        p.terminate()
    deadline = time.time() + STOP_GRACE
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def phase(name: str, base: Path, params: dict, runs: list, env: dict, relay: Relay, out: Path,
          progress=lambda results, elapsed: None, deadline: float | None = None) -> dict:
    """The runs at once, each to its end, or to `deadline` (time.time()), where the runs still going
    are stopped (their records KILLED) and the phase ends `stopped`; `progress` hears of every run that
    ends (its result carries `end_s`, its seconds since the phase began), so a call killed at its
    limit keeps what finished."""
    import yaml

    from stages.experiments.sweep import _merged

    procs = {}
    t0 = time.time()
    results: dict = {}
    ends_with_us = _ends_with_parent()
    completed = False
    try:
        for r in runs:
            d = base / name / r.name
            (d / "data").mkdir(parents=True)
            (d / "data" / "prepared").symlink_to(base / "data" / "prepared")
            (d / "params.yaml").write_text(yaml.safe_dump(_merged(params, r.overrides), sort_keys=False))
            # Its result line to a file of its own: a pipe left unread while other runs are watched could fill.
            with open(d / "run.log", "w") as log, open(d / "result.out", "w") as res:
                procs[r.name] = (d, subprocess.Popen([sys.executable, __file__, "--child", str(d)], env=env,
                                                     stdout=res, stderr=log, preexec_fn=ends_with_us))
        progress({}, 0.0)
        stopped = False
        while procs:
            time.sleep(1.0)
            if deadline is not None and time.time() >= deadline and not stopped:
                print(f"{name}: --seconds spent; stopping {len(procs)} run(s)", flush=True)
                stop_all([p for _, p in procs.values()])  # each ends now; the loop below records it
                stopped = True
            for k, (d, _) in procs.items():
                relay(f"{name}/{k}", d / "run.log")
            ended = [k for k, (_, p) in procs.items() if p.poll() is not None]
            for k in ended:
                d, p = procs.pop(k)
                relay(f"{name}/{k}", d / "run.log", final=True)
                text = (d / "result.out").read_text().strip()
                res = json.loads(text.splitlines()[-1]) if p.returncode == 0 and text else None
                if res is None and stopped:
                    res = {"failed": "stopped at the call's --seconds", "stopped": True}
                if res is None:
                    tail = (d / "run.log").read_text().strip().splitlines()[-3:]
                    res = {"failed": f"exit {p.returncode}: " + " | ".join(tail)[-600:]}
                results[k] = {**res, "end_s": round(time.time() - t0, 1)}
            if ended:  # as each run ends, whichever it is: a call cut short keeps every finished run's record
                try:
                    pack(base / "journal", out)
                except OSError as e:  # the runs go on; the last archive stays, the next pack tries again
                    print(f"journal.tar.gz not repacked: {e}", flush=True)
                progress(dict(results), time.time() - t0)
        completed = True
    finally:  # stopped (SIGTERM, Ctrl-C) or failed: no run goes on training unwatched, then the record
        if not completed:
            stop_all([p for _, p in procs.values()])
            try:  # the stopped runs' records (KILLED) too: what finished must not wait on them
                pack(base / "journal", out)
            except Exception as e:
                print(f"journal.tar.gz not repacked: {type(e).__name__}: {e}", flush=True)
            try:
                progress(dict(results), time.time() - t0)
            except Exception as e:  # the exception under way is the one to report
                print(f"runs_gpu.json not rewritten: {type(e).__name__}: {e}", flush=True)
    results = {r.name: results[r.name] for r in runs}
    return {"runs": results, "wall_s": time.time() - t0, **({"stopped": True} if stopped else {})}


def rates(res: dict, runs_at_once: int, epochs: int) -> None:
    """A phase's runs/hour: `runs_per_hour`, its finished runs over its wall time (a lower bound for a
    sweep: once its first runs end the GPU is part-empty), and `slot_runs_per_hour`, runs at once x
    3600 / the finished runs' mean time (what a sweep keeping every slot busy would approach, if a run
    took as long beside others of its kind), each also at the full protocol's 50 epochs (x epochs / 50:
    an underestimate where the epochs are fewer, since a run's fixed costs do not shrink)."""
    import statistics

    ends = [v["end_s"] for v in res["runs"].values() if "failed" not in v and "end_s" in v]
    res["runs_per_hour"] = len(ends) * 3600 / res["wall_s"] if ends else 0.0
    res["slot_runs_per_hour"] = runs_at_once * 3600 / statistics.fmean(ends) if ends else 0.0
    res["full_protocol_runs_per_hour"] = res["runs_per_hour"] * epochs / FULL_EPOCHS
    res["full_protocol_slot_runs_per_hour"] = res["slot_runs_per_hour"] * epochs / FULL_EPOCHS


def merge_refusal(earlier: dict, now: dict) -> str | None:
    """Why an earlier call's runs cannot sit beside this call's (another GPU model, budget, data or
    --set, a number format among them: a bf16 run replaced an fp32 one of its name, and was labelled
    with the other's settings), or None; a key the earlier record lacks (an older version's, or not
    known yet) is not compared."""
    for key, what in (("device", "device"), ("gpu", "GPU model"), ("width", "width"), ("epochs", "epochs a task"),
                      ("data", "data (the prepared manifest's hash)"), ("set", "--set")):
        if key in earlier and key in now and earlier[key] != now[key]:
            return (f"its runs had {what} {earlier[key]}, this call's {now[key]}: compare runs of one GPU model, "
                    "budget, data and settings only (formats side by side: a call each, never merged)")
    return None


def graphs_vs_eager(eager: dict, graphs: dict) -> dict:
    """Per row (PBR, ER), the final Class-IL of the seeds both phases finished: each seed's, the mean of
    graphs - eager, and the standard deviation of the eager seeds (issue 25 asks the difference to lie
    within the seed spread, three seeds at least)."""
    import statistics

    rows: dict = {}
    for name in sorted(eager):
        if "class_il" in eager[name] and "class_il" in graphs.get(name, {}):
            row, seed = name.rsplit("-s", 1)
            rows.setdefault(row, []).append((int(seed), eager[name]["class_il"], graphs[name]["class_il"]))
    out = {}
    for row, got in rows.items():
        got.sort()
        e, g = [x[1] for x in got], [x[2] for x in got]
        out[row] = {"seeds": [x[0] for x in got], "eager": [round(x, 2) for x in e], "graphs": [round(x, 2) for x in g],
                    "mean_diff": statistics.fmean(b - a for a, b in zip(e, g)),
                    "eager_std": statistics.stdev(e) if len(e) > 1 else 0.0}
    return out


def _replace(path: Path, text: str) -> None:
    """Written whole or not at all: a call killed at its limit mid-write keeps the last complete file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def write(out: Path, result: dict, quiet: bool = False) -> None:
    """runs_gpu.json and runs_gpu.md as they stand (after every run and phase: a call cut short keeps
    them); printed unless `quiet`."""
    ran = {k: {**v.get("earlier_runs", {}), **v.get("runs", {})} for k, v in result["phases"].items()}
    both = [k for k in ran.get("off", {}) if k in ran.get("mps", {})]
    result["same_seeds"] = {k: {p: ran[p][k].get("class_il") for p in ran if k in ran[p]} for k in both}
    result["same_rows"] = all(ran["mps"][k].get("class_il_rows") == ran["off"][k].get("class_il_rows") for k in both)
    result["graphs_vs_eager"] = graphs_vs_eager(ran.get("mps", {}), ran.get("mps-graphs", {}))
    _replace(out / "runs_gpu.json", json.dumps(result, indent=1))
    lines = [f"# whole runs, {result['meta']}", "", "| phase | runs at once | MPS | wall s | runs/hour at this budget: "
             "over the wall time (a lower bound), slots / mean run time | the same at the full protocol |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name, res in result["phases"].items():
        if "running" in res:  # the call ended (or was cut) while this phase ran
            done = {k: v.get("end_s") for k, v in res["runs"].items()}
            lines.append(f"| {name} | {res['runs_at_once']} | {res['mps']} | still running after {res['running']:.0f} s;"
                         f" ended (s): {done} | | |")
            continue
        if "wall_s" not in res:
            lines.append(f"| {name} | {res['runs_at_once']} | {res['mps']} | {res.get('skipped') or res.get('failed')} | | |")
            continue
        failed = [k for k, v in res["runs"].items() if "failed" in v]
        # The per-slot figures are absent from the records of earlier versions (--merge).
        slot, full_slot = (f"{res[k]:.1f}" if k in res else "-" for k in ("slot_runs_per_hour",
                                                                         "full_protocol_slot_runs_per_hour"))
        lines.append(f"| {name} | {res['runs_at_once']} | {res['mps']} | {res['wall_s']:.0f} | {res['runs_per_hour']:.1f}, "
                     f"{slot} | {res['full_protocol_runs_per_hour']:.1f}, {full_slot} |"
                     + (" stopped at --seconds: the finished runs are the faster ones" if res.get("stopped") else "")
                     + (f" (beside {len(res['earlier_runs'])} runs of an earlier call, --merge)"
                        if res.get("earlier_runs") else "")
                     + (f" failed: {failed}" if failed else "") + (f" {res['runs_cut']}" if res.get("runs_cut") else ""))
    lines += ["", f"seeds in both mps and off, final Class-IL by phase: {result['same_seeds']}; mps and off rows "
              f"identical: {result['same_rows']}"]
    g = result["graphs_vs_eager"]
    if g:
        def said(phase):  # a merged phase may have run with other --set values than this call's
            got = result["phases"][phase].get("set")
            return f", {' '.join(got)}" if got else ""

        lines += ["", f"final Class-IL, eager (mps{said('mps')}) against CUDA graphs (mps-graphs{said('mps-graphs')}), "
                  "same seeds:", "",
                  "| row | seeds | eager, each seed | graphs, each seed | graphs - eager, mean | eager seeds' std |",
                  "| --- | --- | --- | --- | --- | --- |"]
        lines += [f"| {row} | {v['seeds']} | {v['eager']} | {v['graphs']} | {v['mean_diff']:+.2f} | "
                  f"{v['eager_std']:.2f} |" for row, v in g.items()]
    _replace(out / "runs_gpu.md", "\n".join(lines) + "\n")
    if not quiet:
        print("\n".join(lines), flush=True)


PHASES = ("mps", "off", "mps-graphs")


def parser() -> argparse.ArgumentParser:
    """The call's options (tests/test_bench_runs_gpu.py parses docs/gpu.md's commands with it)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=10, help="epochs a task (the full protocol has 50)")
    ap.add_argument("--mps-runs", type=int, default=8)
    ap.add_argument("--off-runs", type=int, default=4)
    ap.add_argument("--phases", default="mps,off,mps-graphs", help="comma list of mps, off, mps-graphs, in order")
    ap.add_argument("--small", action="store_true", help="200 training images a class: a smoke check")
    ap.add_argument("--prepared", type=Path, help="train on this `pbr prepare` output (its folder, or a .tar.xz "
                    "of data/prepared) instead of random pixels: accuracy, not only speed")
    ap.add_argument("--merge", type=Path, help="an earlier call's runs_gpu.json (same GPU model): its phases that "
                    "this call does not run join the tables, so eager and graphs may run in two calls")
    ap.add_argument("--rows", default=",".join(ROWS), help="the fidelity grid's rows the runs take, seed "
                    "by seed (as `pbr sweep fidelity --only row=...`)")
    ap.add_argument("--seeds", help="the seeds, as `pbr sweep --seeds` takes them (3-4, or 0,2); default from 0, "
                    "as many as the runs of the largest phase need")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a params.yaml setting for every run of the call, as `dvc exp run -S` takes it "
                         "(train.precision=bf16, train.channels_last=true); repeatable, recorded in the meta")
    ap.add_argument("--seconds", type=float, help="stop the runs still going this long after the call began "
                    "(their records KILLED, the journal packed, the MPS daemon quit), so that a call's own end, "
                    "not the device tool's kill, closes it; later phases are skipped")
    ap.add_argument("--out", default=os.environ.get("OUT") or "bench_runs_gpu_out")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    return ap


def main() -> None:
    a = parser().parse_args()
    sys.path.insert(0, str(ROOT))
    if a.child:
        return child(a.child)
    # A call stopped at its limit (SIGTERM) unwinds as Ctrl-C does: its runs are stopped and the MPS
    # daemon quits, so the next call finds the GPU as this one found it.
    sys.path.insert(0, str(HERE))
    from common import compile_threads, exit_on_sigterm

    exit_on_sigterm()
    from stages.experiments.sweep import _merged, parse_seeds, plan
    from stages.runtime import mps

    deadline = time.time() + a.seconds if a.seconds else None
    unknown = [p for p in a.phases.split(",") if p not in PHASES]
    if unknown:  # before torch's import and the data: a typo costs no device time
        raise SystemExit(f"--phases: {', '.join(unknown)} unknown; give a comma list of {', '.join(PHASES)}")
    rows = a.rows.split(",")
    from pbr.errors import UserError

    try:
        seeds = parse_seeds(a.seeds) if a.seeds else list(range(max(a.mps_runs, a.off_runs) // len(rows) + 1))
    except UserError as e:
        raise SystemExit(str(e)) from None
    over = settings(a.set, a.rows, seeds)  # before anything is prepared: a bad --set costs no device time
    # The files it reads, before the output folder is made: a missing one left an empty --out behind.
    for flag, path in (("--prepared", a.prepared), ("--merge", a.merge)):
        if path is not None and not Path(path).exists():
            raise SystemExit(f"{flag} {path}: no such file or folder")
    if a.prepared is not None and Path(a.prepared).is_file() and not tarfile.is_tarfile(a.prepared):
        raise SystemExit(f"--prepared {a.prepared}: not a tar archive (pack it with `tar -cJf gpu-carry/prepared.tar.xz "
                         "data/prepared` after `pbr prepare`)")
    earlier = None
    if a.merge:
        try:
            earlier = json.loads(Path(a.merge).read_text())
        except (OSError, ValueError) as e:
            raise SystemExit(f"--merge {a.merge}: not a runs_gpu.json this script wrote ({type(e).__name__})") from None
        if not (isinstance(earlier, dict) and isinstance(earlier.get("meta"), dict)
                and isinstance(earlier.get("phases"), dict)):
            raise SystemExit(f"--merge {a.merge}: not a runs_gpu.json this script wrote (no meta and phases)")
    out = Path(a.out)
    from stages.runtime import journal
    from stages.runtime.tracking import git_state

    git = git_state()  # the GPU machine's copy has no .git: there from PBR_GIT_COMMIT, given in the call
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
           "OMP_NUM_THREADS": "1", "PBR_GIT_COMMIT": git["git.commit"], "PBR_GIT_DIRTY": git["git.dirty"]}
    # `set` with the rest, before the merge's check reads it (set later, the check never saw it).
    result = {"meta": {"device": a.device, "width": a.width, "epochs": a.epochs, "set": sorted(a.set),
                       "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}, "phases": {}}
    if a.device == "cuda":
        import torch

        result["meta"]["gpu"] = torch.cuda.get_device_name(0)
        result["meta"]["torch"] = torch.__version__
    earlier_runs: dict[str, dict] = {}
    if earlier is not None:
        differ = merge_refusal(earlier["meta"], result["meta"])
        if differ:
            raise SystemExit(f"--merge {a.merge}: {differ}")
        result["meta"]["merged"] = {"from": str(a.merge), "meta": earlier["meta"]}
        result["phases"] = {k: v for k, v in earlier["phases"].items() if k not in a.phases.split(",")}
        # A phase this call runs again adds its runs to the earlier call's (an eager side run in
        # two calls, each small enough to finish); its rates are this call's.
        earlier_runs = {k: {**v.get("earlier_runs", {}), **v.get("runs", {})}
                        for k, v in earlier["phases"].items() if k in a.phases.split(",")}
    out.mkdir(parents=True, exist_ok=True)  # after every refusal: none leaves an empty folder
    with tempfile.TemporaryDirectory(prefix="pbr-runs-") as tmp:
        base = Path(tmp)
        env["MLFLOW_TRACKING_URI"] = journal.uri(base / "journal")
        t = time.time()
        params = _merged(prepare(base, a), over)
        from pbr.data.shards import manifest_hash

        result["meta"]["data"] = manifest_hash(base / "data" / "prepared")  # the carried data, or random pixels'
        if a.merge:
            differ = merge_refusal(earlier["meta"], result["meta"])
            if differ:
                raise SystemExit(f"--merge {a.merge}: {differ}")
        result["meta"]["prepare_s"] = round(time.time() - t, 1)
        grid = plan("fidelity", seeds, {}, {"row": rows}, ROOT / "params.yaml", "full")
        by_seed = sorted(grid, key=lambda r: (r.overrides["seed"], r.name))
        stale = carried_refusal(base, params, by_seed)  # before any phase: every run would be refused
        if stale:
            raise SystemExit(stale)
        phases = {"mps": (a.mps_runs, "mps", False), "off": (a.off_runs, "off", False),
                  "mps-graphs": (a.mps_runs, "mps", True)}
        assert set(phases) == set(PHASES)
        relay = Relay(out / "runs.log")

        def earlier(name):
            return {"earlier_runs": earlier_runs[name]} if name in earlier_runs else {}

        for name in a.phases.split(","):
            n, mode, graphs = phases[name]
            n = min(n, len(by_seed))  # the runs this phase has (--seeds may give fewer)
            on = a.device == "cuda"
            if deadline is not None and time.time() >= deadline:
                result["phases"][name] = {"runs_at_once": n, "mps": False, "skipped": "--seconds spent"}
                write(out, result, quiet=True)
                continue
            if graphs and not on:
                result["phases"][name] = {"runs_at_once": n, "mps": False, "skipped": "CUDA graphs need a GPU"}
                write(out, result, quiet=True)
                continue
            p = {**params, "train": {**params["train"], "compile": "graphs" if graphs else False}}
            # MPS where it starts (auto): where it does not, the phase runs time-slicing and says so, so a
            # GPU without MPS still gives the runs and their accuracy.
            shared = False
            todo, cut = by_seed[:n], {}  # the runs, the first seed's only where MPS does not start

            def progress(results, elapsed, name=name, todo=todo, cut=cut):
                result["phases"][name] = {"runs": results, "running": elapsed, "runs_at_once": len(todo),
                                          "mps": shared, "set": a.set, **cut, **earlier(name)}
                write(out, result, quiet=True)

            said: list[str] = []  # why MPS did not start, for the phase's row

            def tell(m, said=said):
                print(m, flush=True)
                said.append(m)

            try:
                with mps.shared("auto" if mode == "mps" else "off", on, log=tell) as shared:
                    if mode == "mps" and on and not shared and todo:
                        # Time-sliced, runs go at the no-MPS pace (docs/benchmarks.md: three full-protocol runs,
                        # about 3.8 ER runs' work, took 319-334 s side by side: ~87 s an ER run) and end together:
                        # call 1's 4 runs (5 ER runs, ~435 s) with the start-up and the probe could reach
                        # --seconds with none finished. One seed's runs finish and give the accuracy.
                        first = todo[0].overrides["seed"]
                        todo[:] = [r for r in todo if r.overrides["seed"] == first]
                        cut["runs_cut"] = (f"MPS did not start: seed {first}'s {len(todo)} runs only, of {n} (time-"
                                           f"slicing, {n} would not end within the call)")
                        print(f"{name}: {cut['runs_cut']}", flush=True)
                    child_env = {**env, **(compile_threads(len(todo)) if graphs else {})}
                    res = phase(name, base, p, todo, {**child_env, **{k: os.environ[k] for k in
                                                                      (mps.PIPE, mps.LOG) if k in os.environ}},
                                relay, out, progress, deadline)
            except Exception as e:  # recorded; the next phase still runs
                res = {"failed": f"{type(e).__name__}: {e}"}
            res.update(runs_at_once=len(todo), mps=bool(shared), set=a.set, **({"mps_note": said[-1]} if said else {}),
                       **cut, **earlier(name))
            if "wall_s" in res:
                rates(res, len(todo), a.epochs)
            result["phases"][name] = res
            write(out, result, quiet=True)  # the files as each phase ends; the table printed once, below
    write(out, result)


if __name__ == "__main__":
    main()
