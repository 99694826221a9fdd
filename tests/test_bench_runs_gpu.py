"""The pieces of benchmarks/bench_runs_gpu.py a GPU session cannot afford to find broken: unpacking
the carried data set, and the graphs-against-eager comparison it reports (the runs need a GPU)."""

import importlib.util
import json
import subprocess

import pytest

from conftest import ROOT

spec = importlib.util.spec_from_file_location("bench_runs_gpu", ROOT / "benchmarks/bench_runs_gpu.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_graphs_against_eager_by_hand():
    eager = {"fid-pbr-s0": {"class_il": 50.0}, "fid-pbr-s1": {"class_il": 52.0}, "fid-pbr-s2": {"class_il": 48.0},
             "fid-er-lr0.1-s0": {"class_il": 40.0}, "fid-er-lr0.1-s1": {"class_il": 44.0}}
    graphs = {"fid-pbr-s0": {"class_il": 51.0}, "fid-pbr-s1": {"class_il": 51.0}, "fid-pbr-s2": {"class_il": 49.0},
              "fid-er-lr0.1-s0": {"class_il": 43.0}, "fid-er-lr0.1-s1": {"failed": "exit 1"}}
    got = bench.graphs_vs_eager(eager, graphs)
    assert got["fid-pbr"]["seeds"] == [0, 1, 2]
    assert got["fid-pbr"]["mean_diff"] == pytest.approx((1 - 1 + 1) / 3)
    assert got["fid-pbr"]["eager_std"] == pytest.approx(2.0)  # (50, 52, 48): deviations 0, 2, -2 over n - 1 = 2
    # A seed that failed in one phase is left out of both: ER keeps seed 0 alone.
    assert got["fid-er-lr0.1"] == {"seeds": [0], "eager": [40.0], "graphs": [43.0], "mean_diff": 3.0, "eager_std": 0.0}


def test_rates_by_hand():
    """Two of three runs finished (at 100 and 200 s of a 300 s phase, 10 epochs a task)."""
    res = {"runs": {"a": {"class_il": 1.0, "end_s": 100.0}, "b": {"class_il": 1.0, "end_s": 200.0},
                    "c": {"failed": "exit 1", "end_s": 300.0}}, "wall_s": 300.0}
    bench.rates(res, 3, 10)
    assert res["runs_per_hour"] == pytest.approx(2 * 3600 / 300)  # 24: a failed run is no run
    assert res["slot_runs_per_hour"] == pytest.approx(3 * 3600 / 150)  # 72: three slots, 150 s a run
    assert res["full_protocol_runs_per_hour"] == pytest.approx(24 * 10 / 50)
    assert res["full_protocol_slot_runs_per_hour"] == pytest.approx(72 * 10 / 50)


def test_the_relay_appends_whole_lines_of_every_run_once(tmp_path):
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_text("[ 1 s] task 1/5\n[ 2 s] epo")
    b.write_text("")
    relay = bench.Relay(tmp_path / "runs.log")
    relay("mps/pbr-s0", a)
    relay("mps/er-s0", b)
    with open(a, "a") as f:
        f.write("ch 1/4\n")
    b.write_text("[ 3 s] task 1/5\n")
    relay("mps/pbr-s0", a)
    relay("mps/er-s0", b)
    relay("mps/pbr-s0", a)  # nothing new: nothing appended
    assert (tmp_path / "runs.log").read_text().splitlines() == [
        "mps/pbr-s0 [ 1 s] task 1/5", "mps/pbr-s0 [ 2 s] epoch 1/4", "mps/er-s0 [ 3 s] task 1/5"]


def test_set_reads_values_as_yaml_and_refuses_what_would_not_run_as_recorded():
    got = bench.settings(["train.precision=bf16", "train.channels_last=true", "method.pbr.tau1=0.5"], "pbr,er-lr0.1",
                         [0, 1])
    assert got == {"train.precision": "bf16", "train.channels_last": True, "method.pbr.tau1": 0.5}
    refused = {
        "train.precison=bf16": "train.precison",  # a typo: no such key
        "train.precision=bf17": "train.precision",  # no such value
        "train.precision": "key=value",
        "model.width=32": "the call sets it",  # --width's
        "train.compile=true": "the call sets it",  # the phases'
        "seed=5": "the call sets it",  # --seeds'
        "method.buffer_size=500": "the call sets it",  # the rows'
        "data.imbalance_ratio=0.1": "the call sets it",  # the prepared data's
    }
    for bad, says in refused.items():
        with pytest.raises(SystemExit, match=says):
            bench.settings([bad], "pbr,er-lr0.1", [0])


def test_a_packed_prepared_folder_unpacks_with_its_data_settings(tmp_path):
    repo = tmp_path / "repo"
    (repo / "data/prepared/task_00").mkdir(parents=True)
    manifest = {"params": {"dataset": "cifar10", "root": "/somewhere/else", "download": False, "setting": "ordered",
                           "imbalance_ratio": 0.01, "n_tasks": 5}}
    (repo / "data/prepared/manifest.json").write_text(json.dumps(manifest))
    (repo / "data/prepared/task_00/train.parquet").write_bytes(b"shard bytes")
    # The command docs/gpu.md gives (xz on every core: -T0 packs in blocks), to a folder of ours.
    [pack] = [line for line in (ROOT / "docs/gpu.md").read_text().splitlines() if " tar -cJf " in line]
    pack = pack.split("&& ", 2)[-1].replace("gpu-carry/", "")
    assert pack.startswith("XZ_OPT=-T0 tar -cJf"), pack
    subprocess.run(pack, shell=True, cwd=repo, check=True)
    for source, where in ((repo / "prepared.tar.xz", tmp_path / "unpacked"), (repo / "data/prepared", tmp_path / "linked")):
        data = bench.carried(source, where / "data" / "prepared")
        # The machine-local keys are not the runs' business; the rest says what they train on.
        assert data == {"dataset": "cifar10", "setting": "ordered", "imbalance_ratio": 0.01, "n_tasks": 5}
        assert (where / "data/prepared/task_00/train.parquet").read_bytes() == b"shard bytes"
    with pytest.raises(SystemExit, match="no data/prepared/manifest.json"):
        bench.carried(tmp_path / "linked", tmp_path / "empty" / "data" / "prepared")


def test_a_run_records_to_plain_files_that_import_as_a_finished_run(tmp_path, finished, monkeypatch, capsys):
    """A run as the GPU call runs it (the train and evaluate stages, recorded to plain files), packed
    as the call returns it, then unpacked here: one complete run holding what the run printed."""
    import shutil
    import tarfile

    from project import copy_project
    from stages.experiments import report, sync
    from stages.runtime import journal

    run = copy_project(finished, tmp_path / "run")
    shutil.rmtree(run / "artifacts/train")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", journal.uri(tmp_path / "j"))
    monkeypatch.setenv("PBR_GIT_COMMIT", "0123abc")
    monkeypatch.chdir(tmp_path)
    bench.child(run)
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    (tmp_path / "out").mkdir()
    (tmp_path / "j/pbr/.tags.json.123.tmp").write_text("{")  # another run's file mid-replace: left out
    bench.pack(tmp_path / "j", tmp_path / "out")
    with tarfile.open(tmp_path / "out/journal.tar.gz") as tar:
        assert not [n for n in tar.getnames() if n.endswith(".tmp")]
        tar.extractall(tmp_path / "back")
    # What `pbr import` reads (a journal imports as the MLflow store would: tests/test_sync.py).
    assert sync.resolve_source(str(tmp_path / "back")).uri == journal.uri(tmp_path / "back/journal")
    [got] = journal.Reader(tmp_path / "back/journal").search_runs(["pbr"])
    assert got.info.status == "FINISHED" and got.data.tags[report.COMPLETE_TAG] == "true"
    assert got.data.tags["git.commit"] == "0123abc" and got.data.tags["pbr.stage.train"] == "done"
    assert got.data.metrics["class_il.acc"] == pytest.approx(printed["class_il"], abs=1e-3)


def test_a_stopped_phase_kills_its_runs_and_records_what_finished(tmp_path, monkeypatch):
    """A phase stopped while its runs train (here: the record written as a run ends raises, as a
    SIGTERM would there): the runs are stopped, even runs that ignore SIGTERM, and even where the
    stop's own record fails, and the records say which had ended."""
    import os
    import time
    from types import SimpleNamespace

    # Each "run" writes its pid, then sleeps, ignoring SIGTERM; "fast" ends at once.
    fake = tmp_path / "run.py"
    fake.write_text("import os, signal, sys, time\nfrom pathlib import Path\nd = Path(sys.argv[2])\n"
                    "(d / 'pid').write_text(str(os.getpid()))\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                    "print('[ 0 s] started', file=sys.stderr, flush=True)\n"
                    "if d.name != 'fast':\n    time.sleep(120)\nprint('{\"class_il\": 50.0}')\n")
    monkeypatch.setattr(bench, "__file__", str(fake))
    monkeypatch.setattr(bench, "STOP_GRACE", 1.0)
    (tmp_path / "data/prepared").mkdir(parents=True)
    runs = [SimpleNamespace(name=n, overrides={}) for n in ("fast", "slow1", "slow2")]
    records = []

    def progress(results, elapsed):
        records.append(results)
        if len(records) == 2:  # the fast run has ended: now stop
            raise SystemExit(143)
        if len(records) == 3:  # the stop's own record fails too (e.g. an older --merge file): still stopped
            raise KeyError("slot_runs_per_hour")

    relay = bench.Relay(tmp_path / "runs.log")
    t = time.time()
    with pytest.raises(SystemExit):  # the stop, not the failed record
        bench.phase("mps", tmp_path, {"train": {}}, runs, dict(os.environ), relay, tmp_path, progress)
    assert time.time() - t < 30  # a second each, not a hang
    for r in runs:
        pid = int((tmp_path / "mps" / r.name / "pid").read_text())
        with pytest.raises(ProcessLookupError):  # ended and reaped
            os.kill(pid, 0)
    # Started (nothing ended), the fast run ended, then the stop's own record.
    assert records[0] == {} and list(records[1]) == ["fast"] and list(records[2]) == ["fast"]
    assert records[1]["fast"]["class_il"] == 50.0
    assert "mps/fast [ 0 s] started" in (tmp_path / "runs.log").read_text().splitlines()


def test_a_runs_death_signal_is_looked_up_before_the_fork(tmp_path, monkeypatch):
    """The runs' preexec_fn dlopened libc (ctypes.CDLL) in each forked child, after the parent had
    started CUDA's threads: a loader lock held at the fork would hang the run before it started.
    The lookup is the parent's; the children only call prctl."""
    import ctypes
    import os
    from types import SimpleNamespace

    real, calls = ctypes.CDLL, tmp_path / "cdll-pids"

    def spy(*args, **kw):  # in a forked child too: its pid to the file
        with open(calls, "a") as f:
            f.write(f"{os.getpid()}\n")
        return real(*args, **kw)

    monkeypatch.setattr(ctypes, "CDLL", spy)
    fake = tmp_path / "run.py"
    fake.write_text("print('{\"class_il\": 50.0}')\n")
    monkeypatch.setattr(bench, "__file__", str(fake))
    (tmp_path / "data/prepared").mkdir(parents=True)
    runs = [SimpleNamespace(name=n, overrides={}) for n in ("a", "b")]
    res = bench.phase("mps", tmp_path, {"train": {}}, runs, dict(os.environ), bench.Relay(tmp_path / "runs.log"),
                      tmp_path)
    assert [v["class_il"] for v in res["runs"].values()] == [50.0, 50.0]
    assert set(calls.read_text().split()) == {str(os.getpid())}


def test_the_calls_deadline_stops_its_runs_and_says_so(tmp_path, monkeypatch):
    """--seconds: the runs still going at the deadline are stopped by the call itself (the device
    tool's kill at its limit left records RUNNING, which `pbr import` waits on for ever), the phase
    says it was stopped, and the finished run keeps its result."""
    import os
    import time
    from types import SimpleNamespace

    fake = tmp_path / "run.py"
    fake.write_text("import sys, time\nfrom pathlib import Path\nd = Path(sys.argv[2])\n"
                    "if d.name != 'fast':\n    time.sleep(120)\nprint('{\"class_il\": 50.0}')\n")
    monkeypatch.setattr(bench, "__file__", str(fake))
    (tmp_path / "data/prepared").mkdir(parents=True)
    runs = [SimpleNamespace(name=n, overrides={}) for n in ("fast", "slow")]
    t = time.time()
    res = bench.phase("mps", tmp_path, {"train": {}}, runs, dict(os.environ), bench.Relay(tmp_path / "runs.log"),
                      tmp_path, deadline=t + 3)
    assert time.time() - t < 30 and res["stopped"] is True
    assert res["runs"]["fast"]["class_il"] == 50.0
    assert res["runs"]["slow"]["failed"] == "stopped at the call's --seconds"
    bench.rates(res, 2, 10)  # one finished run over the phase's wall time
    assert res["runs_per_hour"] == pytest.approx(3600 / res["wall_s"])


def test_an_mps_phase_without_mps_runs_its_first_seed_only(tmp_path, monkeypatch, capsys):
    """Where MPS does not start on the GPU, an mps phase time-slices: call 1's 4 runs at the no-MPS
    pace (about 435 s of GPU), all ending together, could reach --seconds with none finished. It runs
    seed 0's two and says so; the off phase keeps its runs."""
    import signal
    import sys

    import torch

    from stages.runtime import mps

    fake = tmp_path / "run.py"  # each "run" ends at once
    fake.write_text("print('{\"class_il\": 50.0}')\n")
    monkeypatch.setattr(bench, "__file__", str(fake))
    monkeypatch.setattr(mps, "CONTROL", "no-such-nvidia-cuda-mps-control")  # the daemon does not start
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "NVIDIA H200")
    monkeypatch.delenv(mps.PIPE, raising=False)
    monkeypatch.setattr(sys, "argv", ["bench_runs_gpu.py", "--small", "--width", "4", "--seeds", "0-1", "--mps-runs",
                                      "4", "--off-runs", "4", "--phases", "mps,off", "--out", str(tmp_path / "out")])
    old = signal.getsignal(signal.SIGTERM)  # main() takes SIGTERM as Ctrl-C
    try:
        bench.main()
    finally:
        signal.signal(signal.SIGTERM, old)
    got = json.loads((tmp_path / "out/runs_gpu.json").read_text())["phases"]
    assert sorted(got["mps"]["runs"]) == ["fid-er-lr0.1-s0", "fid-pbr-s0"] and got["mps"]["runs_at_once"] == 2
    assert got["mps"]["mps"] is False and "not on PATH" in got["mps"]["mps_note"]
    assert got["mps"]["runs_cut"] == ("MPS did not start: seed 0's 2 runs only, of 4 (time-slicing, 4 would not end "
                                      "within the call)")
    ends = [v["end_s"] for v in got["mps"]["runs"].values()]
    assert got["mps"]["slot_runs_per_hour"] == pytest.approx(2 * 3600 / (sum(ends) / 2))  # two slots, not four
    assert len(got["off"]["runs"]) == 4 and "runs_cut" not in got["off"]
    assert "mps: MPS did not start: seed 0's 2 runs only" in capsys.readouterr().out


def test_the_calls_table_is_printed_once(tmp_path, monkeypatch, capsys):
    """It was printed as each phase ended and again at the end: two phases, three tables in the log."""
    import signal
    import sys

    fake = tmp_path / "run.py"  # each "run" ends at once
    fake.write_text("print('{\"class_il\": 50.0}')\n")
    monkeypatch.setattr(bench, "__file__", str(fake))
    monkeypatch.setattr(sys, "argv", ["bench_runs_gpu.py", "--device", "cpu", "--small", "--width", "4", "--seeds", "0-0",
                                      "--mps-runs", "2", "--off-runs", "2", "--phases", "mps,off,mps-graphs",
                                      "--out", str(tmp_path / "out")])
    old = signal.getsignal(signal.SIGTERM)
    try:
        bench.main()
    finally:
        signal.signal(signal.SIGTERM, old)
    printed = capsys.readouterr().out
    assert printed.count("| phase | runs at once |") == 1, printed
    assert "| mps-graphs | 2 | False | CUDA graphs need a GPU | | |" in printed  # the last phase's row in it
    assert (tmp_path / "out/runs_gpu.md").read_text() in printed


def test_a_stopped_run_is_recorded_killed_not_running(tmp_path, finished):
    """A run's process stopped with SIGTERM (the deadline, the call's own stop) marks its record
    KILLED: one left RUNNING never imports (`pbr import` waits for it to finish there)."""
    import os
    import shutil
    import signal
    import sys
    import time

    from project import copy_project
    from stages.runtime import journal

    run = copy_project(finished, tmp_path / "run")
    shutil.rmtree(run / "artifacts/train")
    env = {**os.environ, "MLFLOW_TRACKING_URI": journal.uri(tmp_path / "j"), "PBR_GIT_COMMIT": "0123abc",
           "PYTHONPATH": str(ROOT)}
    with open(tmp_path / "log", "w") as log:
        p = subprocess.Popen([sys.executable, str(ROOT / "benchmarks/bench_runs_gpu.py"), "--child", str(run)],
                             env=env, stdout=log, stderr=log)
        deadline = time.time() + 120

        def training():  # the stage's record made, its tags set: the stage is under way
            return any("pbr.stage" in t.read_text() for t in (tmp_path / "j").glob("pbr/*/tags.json"))

        while time.time() < deadline and not training():
            time.sleep(0.1)
        time.sleep(0.5)
        p.send_signal(signal.SIGTERM)
        assert p.wait(60) != 0
    [got] = journal.Reader(tmp_path / "j").search_runs(["pbr"])
    assert got.info.status == "KILLED", (tmp_path / "log").read_text()[-2000:]


def test_data_carried_with_other_settings_is_refused_before_any_phase(tmp_path):
    """The grid's runs set data.imbalance_ratio 0.01 and so on over the carried data's settings:
    data prepared at IR 0.1 got every run of the call refused by the train stage, a few seconds in,
    after the machine's start and the MPS daemon's."""
    from stages.experiments.sweep import plan
    from stages.runtime.config import from_dict
    from stages.runtime.yaml12 import read_params

    params = read_params(ROOT / "params.yaml")
    runs = plan("fidelity", [0], {}, {"row": ["pbr"]}, ROOT / "params.yaml", "full")
    (tmp_path / "data/prepared").mkdir(parents=True)
    data = from_dict(params).to_dict()["data"]
    for ir, want in ((0.01, ""), (0.1, "data/prepared was built with data.imbalance_ratio = 0.1")):
        (tmp_path / "data/prepared/manifest.json").write_text(json.dumps({"params": {**data, "imbalance_ratio": ir}}))
        got = bench.carried_refusal(tmp_path, params, runs)
        assert (got == want) if not want else (want in got and got.startswith(runs[0].name)), got


def test_the_commands_docs_gpu_md_gives_parse(monkeypatch):
    """A GPU session runs docs/gpu.md's commands as written: an option a script does not have costs
    the call. Every `benchmarks/bench_runs_gpu.py` and `bench_routes.py` command there parses."""
    import re
    import shlex

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # its `common`, as the script finds it
    spec2 = importlib.util.spec_from_file_location("bench_routes", ROOT / "benchmarks/bench_routes.py")
    routes = importlib.util.module_from_spec(spec2)
    spec2.loader.exec_module(routes)
    parsers = {"bench_runs_gpu.py": bench.parser(), "bench_routes.py": routes.parser()}
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "docs/gpu.md").read_text(), re.S)
    seen = {k: 0 for k in parsers}
    for line in "\n".join(blocks).replace("\\\n", " ").splitlines():
        m = re.search(r"benchmarks/(bench_runs_gpu\.py|bench_routes\.py)((?:\s+--?[\w-]+(?:[ =][^\s|`]+)?)*)", line)
        if not m or "python" not in line:
            continue
        args = shlex.split(m.group(2).replace("$OUT", "out").replace("FILE.json", "f.json"))
        parsers[m.group(1)].parse_args(args)  # exits (SystemExit) on an option it does not have
        seen[m.group(1)] += 1
    assert seen["bench_runs_gpu.py"] >= 2 and seen["bench_routes.py"] >= 1, seen
    # Call 2, sized by its script: the number call 1's reply gives in place of LEFT.
    [call2] = [line for line in "\n".join(blocks).splitlines() if "benchmarks/gpu_call2.py" in line]
    args = shlex.split(call2.split("benchmarks/gpu_call2.py", 1)[1].split("2>&1")[0].replace("$OUT", "out"))
    assert args[0] == "LEFT" and _call2().parser().parse_known_args(["400", *args[1:]])[1] == [], args


def test_the_sessions_command_section_opens_with_call_1():
    """The section a GPU session follows opened with the H100 session's routes call (done, 9 of the 15
    minutes): read literally, a session re-measured the routes and never reached call 1."""
    import re

    section = (ROOT / "docs/gpu.md").read_text().split("## The GPU session's command\n", 1)[1].split("\n## ", 1)[0]
    on_gpu = [b for b in re.findall(r"```bash\n(.*?)```", section, re.S) if "benchmarks/" in b]
    assert "benchmarks/bench_runs_gpu.py" in on_gpu[0] and "--prepared" in on_gpu[0], on_gpu[0]
    assert "bench_routes.py --seconds 480" not in section


def _call2():
    spec2 = importlib.util.spec_from_file_location("gpu_call2", ROOT / "benchmarks/gpu_call2.py")
    call2 = importlib.util.module_from_spec(spec2)
    spec2.loader.exec_module(call2)
    return call2


@pytest.mark.parametrize("left,timeout,seconds,graphs_warmup", [
    (700, 600, 540, 120),  # a call's most is 600 s
    (300, 270, 210, 120),
    (241, 211, 151, 120),  # 15 s (baseline, MPS probe) + 120 (compile cap) + 6 (window) + 10
    (240, 210, 150, 80),
    (201, 171, 111, 80),  # 15 + 80 + 6 + 10
    (200, 170, 110, None),  # not even one graphs row: no call
    (20, None, None, None)])
def test_call_2_is_sized_by_the_seconds_call_1_left(left, timeout, seconds, graphs_warmup, monkeypatch):
    """Call 2 came with a literal --seconds 300 and a `status` call and arithmetic between the calls,
    where the warm machine goes back after 30 s idle. Its script takes the seconds left (call 1's
    reply says them): timeout_s = LEFT - 30, bench_routes.py's --seconds a minute less."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import bench_routes

    got_timeout, args, said = _call2().plan(left)
    if graphs_warmup is None:
        assert args is None and said.endswith("no call 2; give the machine back"), said
        return
    a = bench_routes.parser().parse_args(args)
    assert (got_timeout, a.seconds, a.graphs_warmup) == (timeout, seconds, graphs_warmup)
    assert (a.routes, a.mps_processes, a.process_formats) == ("baseline,mps-graphs", "8", "bf16+cl,fp32")


def test_call_2_quits_a_daemon_left_behind_and_runs_bench_routes_as_sized(tmp_path):
    import os
    import sys

    left_behind = tmp_path / "tmp/pbr-mps-abc/pipe"
    left_behind.mkdir(parents=True)
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "nvidia-cuda-mps-control").write_text('#!/bin/sh\n/bin/cat >> "$MARK"\n')
    (bin_ / "nvidia-cuda-mps-control").chmod(0o755)
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"), "MARK": str(tmp_path / "told"),
           "PATH": f"{bin_}{os.pathsep}{os.environ['PATH']}"}
    call = [sys.executable, str(ROOT / "benchmarks/gpu_call2.py")]
    r = subprocess.run([*call, "400", "--out", str(tmp_path / "out"), "--device", "cpu", "--width", "4"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout[-1500:] + r.stderr[-1500:]
    assert (tmp_path / "told").read_text() == "quit\n"
    got = json.loads((tmp_path / "out/routes.json").read_text())
    assert got["meta"]["seconds"] == 310  # 400 - 30 - 60
    assert [(x["route"], x["status"]) for x in got["rows"]] == [("baseline", "ok"), ("mps-graphs", "skipped")]
    # Too little left: nothing runs, said in one line, no folder; a LEFT that is no number: one line.
    r = subprocess.run([*call, "200", "--out", str(tmp_path / "none")], capture_output=True, text=True, timeout=120,
                       env=env)
    assert r.returncode == 0 and "no call 2" in r.stdout and not (tmp_path / "none").exists(), r.stderr
    r = subprocess.run([*call, "LEFT", "--out", str(tmp_path / "none")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stderr.strip() == ("LEFT LEFT: give the device seconds left, a number (call 1's "
                                                      "reply's lease.budget_left_s)")


def test_a_merge_adds_a_phases_runs_and_refuses_other_budgets_or_data(tmp_path):
    """The eager side runs in two calls small enough to finish (runs sharing the GPU end together:
    a call over budget loses them all), the second --merge-ing the first: the phase's runs are both
    calls'. A merge of runs at another width, epochs or data compared runs that are not alike."""
    meta = {"device": "cuda", "gpu": "NVIDIA H200", "width": 64, "epochs": 50, "data": "ab" * 32}
    assert bench.merge_refusal(meta, dict(meta)) is None
    assert bench.merge_refusal({k: v for k, v in meta.items() if k != "data"}, meta) is None  # an older record
    for key, other in (("epochs", 10), ("data", "cd" * 32), ("gpu", "NVIDIA H100 80GB HBM3"), ("width", 32),
                       ("set", ["train.precision=bf16"])):  # a bf16 call's runs pooled with fp32 ones
        assert f"{other}" in bench.merge_refusal({**meta, "set": []}, {**meta, "set": [], key: other})
    result = {"meta": meta, "phases": {
        "mps": {"runs": {"fid-pbr-s2": {"class_il": 48.0}}, "earlier_runs": {
            "fid-pbr-s0": {"class_il": 50.0}, "fid-pbr-s1": {"class_il": 52.0}}, "runs_at_once": 1, "mps": True},
        "mps-graphs": {"runs": {f"fid-pbr-s{s}": {"class_il": c} for s, c in ((0, 51.0), (1, 51.0), (2, 49.0))},
                       "runs_at_once": 3, "mps": True}}}
    bench.write(tmp_path, result, quiet=True)
    got = json.loads((tmp_path / "runs_gpu.json").read_text())["graphs_vs_eager"]["fid-pbr"]
    assert got["seeds"] == [0, 1, 2] and got["eager"] == [50.0, 52.0, 48.0]


def test_an_unknown_phase_stops_the_call_before_anything_is_prepared(tmp_path):
    import sys
    import time

    t = time.time()
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks/bench_runs_gpu.py"), "--device", "cpu", "--phases",
                        "mps_graphs", "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "--phases: mps_graphs unknown" in r.stderr, r.stderr[-1500:]
    assert not (tmp_path / "out").exists() and time.time() - t < 60


def test_bench_routes_reads_its_lists_of_counts_before_it_measures(tmp_path):
    """A typo in --processes (or --mps-processes) came out as a traceback once its route was reached:
    after the baseline, for MPS after its daemon started, the device time before it spent."""
    import sys

    r = subprocess.run([sys.executable, str(ROOT / "benchmarks/bench_routes.py"), "--device", "cpu", "--width", "4",
                        "--routes", "baseline,processes", "--processes", "1,x", "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stderr.strip().splitlines()[-1] == (
        "--processes 1,x: give positive whole numbers, comma separated (e.g. 1,2,4)"), r.stderr[-1500:]
    assert "baseline" not in r.stdout and not (tmp_path / "out").exists()


@pytest.mark.parametrize("args,said", [
    (["--seeds", "x"], "--seeds x: give N"),
    (["--prepared", "missing.tar.xz"], "--prepared missing.tar.xz: no such file or folder"),
    (["--merge", "missing.json"], "--merge missing.json: no such file or folder"),
    (["--merge", "params.yaml"], "--merge params.yaml: not a runs_gpu.json this script wrote"),
    (["--prepared", "params.yaml"], "--prepared params.yaml: not a tar archive"),
    # A bf16 call --merge-ing an fp32 call's file: its runs replaced the other's and took its label.
    (["--set", "train.channels_last=true", "--width", "64", "--epochs", "50", "--merge", "fp32.json"],
     "--merge fp32.json: its runs had --set []")])
def test_bench_runs_gpu_says_a_bad_input_in_one_line_and_makes_no_folder(tmp_path, args, said, monkeypatch):
    """The first through a real process (its exit status and stderr); the others through main() in this
    process (a process costs about 4 CPU s of imports on CI's two cores, for the same lines)."""
    import shutil
    import signal
    import sys

    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    (tmp_path / "fp32.json").write_text(json.dumps({"meta": {"device": "cpu", "width": 64, "epochs": 50, "set": []},
                                                    "phases": {}}))
    if args == ["--seeds", "x"]:
        r = subprocess.run([sys.executable, str(ROOT / "benchmarks/bench_runs_gpu.py"), "--device", "cpu", *args,
                            "--out", "out"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert r.returncode == 1 and r.stderr.strip().splitlines()[-1].startswith(said), r.stderr[-1500:]
        assert "Traceback" not in r.stderr
    else:
        monkeypatch.chdir(tmp_path)
        monkeypatch.setattr(sys, "argv", ["bench_runs_gpu.py", "--device", "cpu", *args, "--out", "out"])
        monkeypatch.setattr(sys, "path", list(sys.path))  # main() puts the project and benchmarks/ first
        sigterm = signal.getsignal(signal.SIGTERM)  # main() makes SIGTERM unwind as Ctrl-C does
        try:
            with pytest.raises(SystemExit) as e:
                bench.main()
        finally:
            signal.signal(signal.SIGTERM, sigterm)
        assert isinstance(e.value.code, str) and e.value.code.startswith(said), e.value.code
    assert not (tmp_path / "out").exists()


def test_a_calls_runs_end_with_it_when_it_is_killed_outright(tmp_path):
    """A call SIGKILLed (a time limit's last word) left its runs training on as orphans: eight of
    them held a 2-core machine for a quarter of an hour."""
    import contextlib
    import os
    import signal
    import sys
    import time

    # Its working folder (8 MB of data) under tmp_path: killed outright, the call cannot remove it.
    (tmp_path / "tmp").mkdir()
    call = subprocess.Popen([sys.executable, str(ROOT / "benchmarks/bench_runs_gpu.py"), "--device", "cpu", "--width",
                             "4", "--small", "--epochs", "50", "--phases", "mps", "--mps-runs", "2", "--out",
                             str(tmp_path / "out")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, env={**os.environ, "TMPDIR": str(tmp_path / "tmp")})

    def runs():  # the call's run processes: its session's, started with --child
        return [p for p in os.listdir("/proc") if p.isdigit() and b"\0--child\0" in _cmdline(p) and _sid(p) == call.pid]

    try:
        deadline = time.time() + 120
        while len(runs()) < 2:
            assert call.poll() is None and time.time() < deadline, "the runs never started"
            time.sleep(0.2)
        call.kill()
        call.wait()
        deadline = time.time() + 30
        while runs():
            assert time.time() < deadline, "the runs outlived the call"
            time.sleep(0.2)
        assert [p.name[:9] for p in (tmp_path / "tmp").iterdir()] == ["pbr-runs-"]  # not left in the machine's /tmp
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(call.pid, signal.SIGKILL)


def _sid(pid: str) -> int | None:
    import os

    try:
        return os.getsid(int(pid))
    except OSError:
        return None


def _cmdline(pid: str) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""
