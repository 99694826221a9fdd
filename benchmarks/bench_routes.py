"""Issue 25's routes to more full-protocol runs per GPU-hour, measured in one call under ten minutes.

    python benchmarks/bench_routes.py --seconds 540 --out $OUT          # a GPU session
    python benchmarks/bench_routes.py --device cpu --width 4 --quick    # a smoke check, about a minute

Routes, in this order (the most telling first, so a spent budget cuts the least telling):
  baseline          one run, eager fp32: Net + SGD on 32 + 32 ready images (the bare step)
  lanes             L runs as one stacked network (pbr.lanes), eager fp32, L in --lanes
  lanes-bf16        the same with bf16 convolutions
  compile           torch.compile(mode="reduce-overhead") (CUDA graphs on a GPU) of the single
                    step and of the laned step at the best eager L; each in a child process, so a
                    crash or a hang is recorded and the script goes on
  processes         N processes each looping the real ER step (bench_parallel.py's own child, run
                    as a script: reused, not copied), summed over one timed window
  lanes-data        lanes plus each lane's own ER data work (its generator, buffer draw,
                    augmentation, reservoir offer): what wiring lanes into a run would pay
  lanes-data-batched  the same with the lanes' augmentation in one call (pbr.lanes.augment:
                    each lane's draws from its own generator, one gather for all)
  lockstep          L whole ER runs, then L whole PBR runs, in lockstep threads (pbr.lockstep): each
                    lane's unchanged observe and task loop (pbr.loop.fit_task) with its own
                    generator, augmentation, replay draw and buffer (PBR: its laned teacher), its
                    network a lane of one Lanes; timed on a second task, where every step replays;
                    what the threads and the GIL cost against lanes-data*, beside one plain run
  lanes-processes   N processes each training L lanes
  mps               processes (and lanes-processes, when that route runs) again under a CUDA MPS
                    daemon started here
                    (user-level, its pipe in a temp folder; stopped at the end)
  graphs-processes  `processes` with each process's network compiled with CUDA graphs
                    (torch.compile, reduce-overhead; the method's buffer and data work stay eager)
  mps-graphs        the same under an MPS daemon, N in --mps-processes: the combination the H100
                    session left to measure (docs/gpu.md)
                    (the four process routes run the ER step in each of --process-formats: fp32,
                    bf16, fp32+cl, bf16+cl, as train.precision / train.channels_last apply them)
  lanes-cl          channels_last lanes, fp32 and bf16 (late: at batch 32 it slowed every method's
                    single step on an H200, docs/benchmarks.md)
  cudnn-benchmark   the best eager lanes with torch.backends.cudnn.benchmark on

Every row: median step time after warm-up, current-task images per second (32 a lane a step;
replay doubles the images the network sees), its ratio to the baseline measured in this run, and
full-protocol runs per hour = 3600 x img/s / 620,000 (a Seq-CIFAR-10-LT run is 12,406 current-task
images a pass x 50 passes, about 0.62 M current-task image-steps, 1.24 M counting replay). The
model-step rows leave out the method's data work; `processes`, `lanes-data*`, `lanes-processes` and
`mps` include it.
Results go to --out as routes.json and routes.md, rewritten after every route.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

from common import compile_threads, exit_on_sigterm, machine, ready_then_wait, row, start_together

FULL_RUN_CURRENT_IMAGES = 620_000
FORMATS = {"fp32", "bf16", "fp32+cl", "bf16+cl"}  # --process-formats
MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2615)
ROUTES = ("baseline", "lanes", "lanes-bf16", "compile", "processes", "lanes-data", "lanes-data-batched",
          "lockstep", "lanes-processes", "mps", "graphs-processes", "mps-graphs", "lanes-cl", "cudnn-benchmark")
HERE = Path(__file__).resolve().parent


def runs_per_hour(img_s: float) -> float:
    return 3600 * img_s / FULL_RUN_CURRENT_IMAGES


# --- what one step is, for each route ------------------------------------------------------------
def _sync(dev):
    import torch

    return torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)


_NETS: list = []


def _nets(a, n, dev):
    """n networks from seeds 0..n-1, on the device, made once (initialising 32 width-64 networks on
    the host takes seconds that every row would otherwise pay); Lanes and SGD copy or own them."""
    import torch

    from pbr.models import Net

    while len(_NETS) < n:
        g = torch.Generator().manual_seed(len(_NETS))
        _NETS.append(Net(10, a.width, "linear", dropout=0.0, generator=g).to(dev))
    return _NETS[:n]


def single_step(a, dev, compiled=False):
    """One run's bare step on a pool of ready 64-image batches; returns step(i)."""
    import torch
    import torch.nn.functional as F

    net = copy.deepcopy(_nets(a, 1, dev)[0])
    if compiled:
        net.compile(mode="reduce-overhead")
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    g = torch.Generator(device=dev).manual_seed(0)
    xs = torch.randn(4, 2 * a.batch, 3, 32, 32, generator=g, device=dev)
    ys = torch.randint(0, 10, (4, 2 * a.batch), generator=g, device=dev)

    def step(i):
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(net(xs[i % 4]), ys[i % 4]).backward()
        opt.step()
    return step


def laned_step(a, dev, n_lanes, dtype="fp32", cl=False, compiled=False, data=""):
    """L lanes' step on per-lane batches. With `data` ("per-lane" or "batched"), each lane first
    does ER's own data work with its own generator and buffer, in ER's order of draws (augment the
    current batch, draw 32 from its memory, augment them, offer the batch to its reservoir);
    "batched" augments all lanes in one call (pbr.lanes.augment, the same draws)."""
    import torch

    from pbr import lanes as lanes_mod
    from pbr.buffer import Buffer
    from pbr.data.augment import Augment
    from pbr.memory.reservoir import Reservoir

    lanes = lanes_mod.Lanes(_nets(a, n_lanes, dev), compute_dtype=torch.bfloat16 if dtype == "bf16" else None,
                            channels_last=cl)
    if compiled:
        lanes.compile(mode="reduce-overhead")
    opt = lanes_mod.sgd(lanes, lr=0.1)
    g = torch.Generator(device=dev).manual_seed(0)
    if not data:
        xs = torch.randn(4, n_lanes, 2 * a.batch, 3, 32, 32, generator=g, device=dev)
        ys = torch.randint(0, 10, (4, n_lanes, 2 * a.batch), generator=g, device=dev)
        return lambda i: lanes_mod.step(lanes, opt, xs[i % 4], ys[i % 4])
    aug = Augment(MEAN, STD)
    gens = [torch.Generator(device=dev).manual_seed(100 + k) for k in range(n_lanes)]
    raw = torch.randint(0, 256, (n_lanes, 8, a.batch, 3, 32, 32), dtype=torch.uint8, device=dev)
    labels = torch.randint(0, 10, (n_lanes, 8, a.batch), device=dev)
    task = torch.zeros(a.batch, dtype=torch.int64, device=dev)
    mems, bufs = [], []
    for k in range(n_lanes):
        mem = Reservoir(Buffer(200, (3, 32, 32), 10, dev), gens[k])
        for j in range(8):
            mem.offer(raw[k, j], labels[k, j], task)
        mems.append(mem)
        bufs.append(mem.buffer)

    def step(i):
        x, y = [], []
        for k in range(n_lanes):
            r, lab = raw[k, i % 8], labels[k, i % 8]
            bimg, blab, _, _ = bufs[k].get(bufs[k].sample(a.batch, gens[k]))
            x.append(torch.cat([aug(r, gens[k]), aug(bimg, gens[k])]))
            y.append(torch.cat([lab, blab]))
            mems[k].offer(r, lab, task)
        lanes_mod.step(lanes, opt, torch.stack(x), torch.stack(y))

    def batched_step(i):
        cur = lanes_mod.augment(raw[:, i % 8], gens, MEAN, STD)
        replay = [bufs[k].get(bufs[k].sample(a.batch, gens[k])) for k in range(n_lanes)]
        old = lanes_mod.augment(torch.stack([b[0] for b in replay]), gens, MEAN, STD)
        for k in range(n_lanes):
            mems[k].offer(raw[k, i % 8], labels[k, i % 8], task)
        y = torch.cat([labels[:, i % 8], torch.stack([b[1] for b in replay])], 1)
        lanes_mod.step(lanes, opt, torch.cat([cur, old], 1), y)
    return batched_step if data == "batched" else step


def lockstep_step_s(a, dev, n_lanes, name="er"):
    """Seconds a step of L whole runs of `name` (n_lanes 0: one plain run, no lockstep) through
    pbr.loop.fit_task: a first task of random images (which also fills the buffer; PBR's walk and
    teacher at its end), then the timed second task, where every step replays (and PBR distils
    from its teacher). The run's own observe, augmentation and memory, as a real run has them."""
    import torch

    from pbr.data.augment import Augment, normalize
    from pbr.lockstep import train_laned
    from pbr.loop import fit_task
    from pbr.methods import Context, create
    from pbr.models import Net

    lanes = max(n_lanes, 1)
    methods = []
    for k in range(lanes):
        # PBR's own network (cosine head, dropout 0.1); ER's is the shared pool's (linear head).
        net = (Net(10, a.width, "cosine", dropout=0.1, generator=torch.Generator().manual_seed(k)).to(dev)
               if name == "pbr" else copy.deepcopy(_nets(a, lanes, dev)[k]))
        ctx = Context(10, [torch.arange(5, device=dev), torch.arange(5, 10, device=dev)], dev, Augment(MEAN, STD),
                      lambda x: normalize(x, MEAN, STD), torch.Generator(device=dev).manual_seed(100 + k),
                      replay_batch_size=a.batch, eval_batch_size=256)
        methods.append(create(name, net, ctx, buffer_size=200, lr=0.1))
    first, timed = a.batch * max(a.warmup, 7), a.batch * a.steps * a.repeats
    g = torch.Generator(device=dev).manual_seed(0)
    raw = [torch.randint(0, 256, (lanes, n, 3, 32, 32), generator=g, dtype=torch.uint8, device=dev) for n in (first, timed)]
    labels = [torch.randint(0, 5, (lanes, first), generator=g, device=dev),
              torch.randint(5, 10, (lanes, timed), generator=g, device=dev)]
    sync, spent = _sync(dev), []

    def run(i, m):
        m.begin_task(0, raw[0][i], labels[0][i])
        fit_task(m, raw[0][i], labels[0][i], 1, a.batch)
        m.end_task(0, raw[0][i], labels[0][i])
        m.begin_task(1, raw[1][i], labels[1][i])
        sync()
        t = time.perf_counter()  # lanes meet again at the first step, within one step of this
        fit_task(m, raw[1][i], labels[1][i], 1, a.batch)
        sync()
        if i == 0:
            spent.append(time.perf_counter() - t)

    if n_lanes == 0:
        run(0, methods[0])
    else:
        train_laned(methods, run)
    return spent[0] / (a.steps * a.repeats)


def autocast_reaches_convs(a, dev) -> str:
    """What dtype torch.autocast gives the convolution kernels of a laned forward on this device
    (on a CPU it leaves them fp32 under vmap, which is why Lanes casts by hand)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from pbr.lanes import Lanes

    seen = set()

    class Spy(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten.convolution.default:
                seen.add(str(args[0].dtype).replace("torch.", ""))
            return func(*args, **(kwargs or {}))

    lanes = Lanes(_nets(a, 2, dev))
    x = torch.randn(2, 4, 3, 32, 32, device=dev)
    with Spy(), torch.autocast(dev.type, dtype=torch.bfloat16), torch.no_grad():
        lanes(x)
    return "/".join(sorted(seen))


def median_step_s(step, sync, warmup, steps, repeats, cap_s):
    """Median seconds a step over `repeats` blocks of `steps` (one sync a block: the launch queue
    stays full, as in training), stopping early once `cap_s` is spent."""
    for i in range(warmup):
        step(i)
    sync()
    times, end = [], time.time() + cap_s
    for _ in range(repeats):
        t = time.perf_counter()
        for i in range(steps):
            step(i)
        sync()
        times.append((time.perf_counter() - t) / steps)
        if time.time() > end:
            break
    return statistics.median(times)


# --- child processes -----------------------------------------------------------------------------
def child(a) -> None:
    import torch

    torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    if a.child == "compile":
        from torch._dynamo.utils import counters

        for artifact in ("cudagraphs", "perf_hints"):  # why CUDA graphs were skipped (the name varies by version)
            try:
                torch._logging.set_logs(**{artifact: True})
                break
            except (TypeError, ValueError):
                continue
        make = (lambda: single_step(a, dev, compiled=True)) if a.lanes_n == 0 else \
            (lambda: laned_step(a, dev, a.lanes_n, a.dtype, compiled=True))
        step = make()
        t = time.time()
        for i in range(3):  # the first calls compile (and record the graphs)
            step(i)
        _sync(dev)()
        compile_s = time.time() - t
        s = median_step_s(step, _sync(dev), 3, a.steps, a.repeats, a.cap)
        print(json.dumps({"step_s": s, "compile_s": compile_s, "graph_breaks": sum(counters["graph_break"].values()),
                          "cudagraph_skips": counters["inductor"]["cudagraph_skips"]}), flush=True)
        return
    # "window": bench_parallel's protocol (start together, loop over one timed window) for lanes
    step = laned_step(a, dev, a.lanes_n, a.dtype, data="batched")
    sync = _sync(dev)
    for i in range(5):
        step(i)
    sync()
    start = ready_then_wait(a.start_folder, a.proc_warmup + 60)
    t0, s = time.time(), 0
    while time.time() < start + a.window:
        step(s)
        s += 1
        if s % 4 == 0:
            sync()
    sync()
    print(json.dumps({"img_s": s * a.batch * a.lanes_n / (time.time() - t0), "late": t0 > start + 0.5}),
          flush=True)


def _last_json(text: str) -> dict | None:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                return None
    return None


def _why(proc_stderr: str, rc) -> str:
    lines = [ln for ln in proc_stderr.strip().splitlines() if ln.strip()]
    err = next((ln for ln in reversed(lines) if "Error" in ln or "error" in ln), lines[-1] if lines else "")
    return f"exit {rc}: {err.strip()[:240]}"


# --- the parent: routes, budget, files -----------------------------------------------------------
class Routes:
    def __init__(self, a):
        import torch

        self.a, self.torch = a, torch
        self.dev = torch.device(a.device)
        self.sync = _sync(self.dev)
        self.deadline = time.time() + a.seconds
        self.out = Path(a.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.rows: list[dict] = []
        self.base: float | None = None
        self.meta = {"machine": machine(), "device": a.device, "width": a.width, "batch": a.batch,
                     "torch": torch.__version__, "seconds": a.seconds, "quick": a.quick,
                     "runs_per_hour": f"3600 x current-task img/s / {FULL_RUN_CURRENT_IMAGES:,} (12,406 current-task "
                                      "images a pass x 50 passes of Seq-CIFAR-10-LT; replay doubles the images seen)",
                     "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
        if self.dev.type == "cuda":
            self.meta["gpu"] = torch.cuda.get_device_name(0)

    def left(self) -> float:
        return self.deadline - time.time()

    def record(self, route, variant, lanes=1, processes=1, step_s=None, img_s=None, note="", status="ok"):
        if step_s is not None and img_s is None:
            img_s = self.a.batch * lanes / step_s
        r = {"route": route, "variant": variant, "lanes": lanes, "processes": processes, "status": status,
             "step_ms": None if step_s is None else round(step_s * 1000, 3),
             "img_s": None if img_s is None else round(img_s, 1),
             "x_baseline": None if img_s is None or not self.base else round(img_s / self.base, 3),
             "runs_per_hour": None if img_s is None else round(runs_per_hour(img_s), 1), "note": note}
        self.rows.append(r)
        name = f"{route} [{variant}] L={lanes} N={processes}"
        if img_s is None:
            print(f"{name:<44} {status}: {note}", flush=True)
        else:
            print(row(name, img_s, self.base) + f"  {r['runs_per_hour']:7.1f} runs/h" + (f"  ({note})" if note else ""),
                  flush=True)
        self.write()

    def write(self) -> None:
        doc = {"meta": self.meta, "rows": self.rows}
        _atomic(self.out / "routes.json", json.dumps(doc, indent=1))
        head = ("| route | variant | L | processes | step ms | current-task img/s | x baseline | runs/hour | note |\n"
                "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
        body = "".join(
            f"| {r['route']} | {r['variant']} | {r['lanes']} | {r['processes']} | {_f(r['step_ms'])} "
            f"| {_f(r['img_s'])} "
            f"| {_f(r['x_baseline'])} | {_f(r['runs_per_hour'])} | {r['status'] if r['status'] != 'ok' else ''}"
            f"{': ' if r['status'] != 'ok' and r['note'] else ''}{r['note']} |\n" for r in self.rows)
        intro = (f"# bench_routes: {self.meta['machine']}\n\nwidth {self.a.width}, batch {self.a.batch} + "
                 f"{self.a.batch} replay, started {self.meta['started']}; "
                 f"runs/hour = {self.meta['runs_per_hour']}.\n\n")
        _atomic(self.out / "routes.md", intro + head + body)

    # each route -----------------------------------------------------------------------------------
    def in_process(self, route, variant, make, lanes=1, note=""):
        """Time make()'s step in this process; an error (say out of memory) is a row, not the end."""
        if self.left() < 5:
            return self.record(route, variant, lanes, status="skipped", note="budget spent")
        a = self.a
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                step = make()
                step(0)
            fallbacks = sorted({str(w.message).split(".")[0][:120] for w in caught})
            s = median_step_s(step, self.sync, a.warmup, a.steps, a.repeats, min(a.cap, self.left()))
            extra = "; ".join([note] + fallbacks if note else fallbacks)
            self.record(route, variant, lanes, step_s=s, note=extra)
            return a.batch * lanes / s
        except Exception as e:  # noqa: BLE001 - one failing combination must not end the run
            why = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            self.record(route, variant, lanes, status="failed", note=why)
            return None
        finally:
            step = None
            if self.dev.type == "cuda":
                self.torch.cuda.empty_cache()

    def lanes_sweep(self, route, dtype, cl=False, data=""):
        best = None
        for n in self.a.lanes:
            img_s = self.in_process(route, dtype, lambda n=n: laned_step(self.a, self.dev, n, dtype, cl=cl, data=data),
                                    lanes=n)
            if img_s and (best is None or img_s > best[0]):
                best = (img_s, n, dtype)
        return best

    def lockstep(self):
        """ER then PBR: one plain run's loop, then L runs in lockstep; an error is a row, not the end."""
        for name in ("er", "pbr"):
            for n in [0] + [k for k in self.a.lanes if k > 1]:
                variant = f"{name.upper()}, fit_task, " + ("one plain run" if n == 0 else "lanes in threads")
                if self.left() < 10:
                    self.record("lockstep", variant, max(n, 1), status="skipped", note="budget spent")
                    continue
                try:
                    self.record("lockstep", variant, max(n, 1), step_s=lockstep_step_s(self.a, self.dev, n, name))
                except Exception as e:  # noqa: BLE001 - one failing combination must not end the run
                    self.record("lockstep", variant, max(n, 1), status="failed",
                                note=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
                finally:
                    if self.dev.type == "cuda":
                        self.torch.cuda.empty_cache()

    def compile_child(self, variant, n_lanes, dtype="fp32"):
        a = self.a
        cap = min(a.compile_cap, self.left() - 5)
        if cap < 30:
            return self.record("compile", variant, max(n_lanes, 1), status="skipped", note="budget spent")
        cmd = [sys.executable, __file__, "--child", "compile", "--device", a.device, "--width", str(a.width),
               "--batch", str(a.batch), "--lanes-n", str(n_lanes), "--dtype", dtype, "--steps", str(a.steps),
               "--repeats", str(a.repeats), "--cap", str(a.cap), "--threads", str(a.threads)]
        t = time.time()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=cap)
        except subprocess.TimeoutExpired:
            return self.record("compile", variant, max(n_lanes, 1), status="failed",
                               note=f"no result within {cap:.0f} s (compiling); killed")
        res = _last_json(p.stdout)
        if p.returncode != 0 or res is None:
            return self.record("compile", variant, max(n_lanes, 1), status="failed", note=_why(p.stderr, p.returncode))
        skipped = [ln.strip()[:160] for ln in p.stderr.splitlines() if "skipping cudagraphs" in ln]
        note = (f"compile {res['compile_s']:.0f} s, child {time.time() - t:.0f} s, {res['graph_breaks']} graph breaks, "
                f"{res['cudagraph_skips']} CUDA-graph skips" + (f"; {skipped[0]}" if skipped else ""))
        self.record("compile", variant, max(n_lanes, 1), step_s=res["step_s"], note=note)

    @staticmethod
    def variant(n_lanes, graphs, fmt):
        """A process row's label, measured or skipped alike."""
        return (f"er step (bench_parallel) {fmt}" + (", graphs" if graphs else "")) if not n_lanes else "fp32+data batched"

    def windows(self, route, n_procs, n_lanes=0, env=None, graphs=False, fmt="fp32"):
        """N children over one timed window: bench_parallel's ER step (n_lanes 0; its network compiled
        with CUDA graphs if `graphs`; `fmt` fp32, bf16, fp32+cl or bf16+cl: train.precision and
        train.channels_last as the pipeline applies them) or our lanes."""
        a = self.a
        warmup = warmup_cap(a, graphs)
        if self.left() < window_need(a, graphs):
            return self.record(route, self.variant(n_lanes, graphs, fmt), max(n_lanes, 1), n_procs,
                               status="skipped", note="budget spent")
        if self.dev.type == "cuda":
            self.torch.cuda.empty_cache()
        if n_lanes:
            cmd = [sys.executable, __file__, "--child", "window", "--lanes-n", str(n_lanes), "--dtype", "fp32",
                   "--threads", "1", "--proc-warmup", str(warmup)]
        else:
            cmd = [sys.executable, str(HERE / "bench_parallel.py"), "--method", "er", "--warmup", str(warmup)]
            cmd += ["--compile", "reduce-overhead"] if graphs else []
            cmd += ["--precision", fmt.split("+")[0]] + (["--channels-last"] if fmt.endswith("+cl") else [])
        env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
        if graphs:
            env.update(compile_threads(n_procs))
        results, errors = [], []
        with tempfile.TemporaryDirectory() as folder:
            cmd += ["--device", a.device, "--width", str(a.width), "--batch", str(a.batch),
                    "--seconds" if not n_lanes else "--window", str(a.window), "--start-folder", folder]
            # Their stderr to files: a pipe nobody reads while they warm up (compile warnings) could fill
            # and stall a child until it reads late.
            errs = [open(Path(folder) / f"stderr-{i}", "w+") for i in range(n_procs)]
            procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=e, text=True, env=env) for e in errs]
            try:
                start = start_together(Path(folder), procs, warmup)
                for p, e in zip(procs, errs):
                    try:
                        out, _ = p.communicate(timeout=max(5.0, start + a.window + 60 - time.time()))
                    except subprocess.TimeoutExpired:
                        p.kill()
                        out, _ = p.communicate()
                    e.seek(0)
                    err = e.read()
                    res = _last_json(out)
                    (results.append(res) if res and p.returncode == 0 else errors.append(_why(err, p.returncode)))
            except BaseException:  # stopped (SIGTERM at the call's limit): no child left holding the GPU
                for p in procs:
                    p.kill()
                raise
            finally:
                for e in errs:
                    e.close()
        variant = self.variant(n_lanes, graphs, fmt)
        if errors:
            return self.record(route, variant, max(n_lanes, 1), n_procs, status="failed",
                               note=f"{len(errors)} of {n_procs} children failed: {errors[0]}")
        late = sum(r["late"] for r in results)
        if late:  # a late child timed a window the others had left: the sum would mean nothing
            return self.record(route, variant, max(n_lanes, 1), n_procs, status="failed",
                               note=f"{late} of {n_procs} started late: raise " + ("--graphs-warmup" if graphs else "--proc-warmup"))
        self.record(route, variant, max(n_lanes, 1), n_procs, img_s=sum(r["img_s"] for r in results),
                    note="summed over the processes")


def warmup_cap(a, graphs: bool) -> float:
    """At most this long for every process of a row to be warmed up (compiled); the window starts once all are."""
    return max(a.proc_warmup, a.graphs_warmup) if graphs else a.proc_warmup


def window_need(a, graphs: bool) -> float:
    """The budget a multi-process row needs left to start (else it is skipped): its warm-up cap, its
    window, 10 s for its processes' start and exit (benchmarks/gpu_call2.py sizes its call by it)."""
    return warmup_cap(a, graphs) + a.window + 10


def _f(v) -> str:
    return "" if v is None else f"{v:,}"


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def parser() -> argparse.ArgumentParser:
    """The call's options (tests/test_bench_runs_gpu.py parses docs/gpu.md's commands with it)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None, help="cuda where there is one, else cpu")
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32, help="current-task images a lane a step (the replay adds as many)")
    ap.add_argument("--lanes", default="1,2,4,8,16,32", help="comma list of L")
    ap.add_argument("--processes", default="1,4", help="comma list of N for the processes route")
    ap.add_argument("--mps-processes", default="4,8")
    ap.add_argument("--process-formats", default="fp32", help="comma list of fp32, bf16, fp32+cl, bf16+cl: the ER step's "
                    "number format and memory format in the processes, mps, graphs-processes and mps-graphs rows")
    ap.add_argument("--routes", default=",".join(ROUTES), help=f"comma list, in this order: {','.join(ROUTES)}")
    ap.add_argument("--seconds", type=float, default=540, help="the whole script's budget; routes past it are skipped")
    ap.add_argument("--out", default=os.environ.get("OUT") or "bench_routes_out")
    ap.add_argument("--quick", action="store_true", help="few steps and lanes: a smoke check")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--cap", type=float, default=25, help="seconds at most to time one row")
    ap.add_argument("--compile-cap", type=float, default=150, help="seconds at most for one compile child")
    ap.add_argument("--proc-warmup", type=float, default=60, help="seconds at most the processes get to start and "
                    "warm up; the timed window starts as soon as all have")
    ap.add_argument("--graphs-warmup", type=float, default=120,
                    help="the same for the compiled processes (compiling in parallel)")
    ap.add_argument("--window", type=float, default=6, help="the processes' timed window")
    ap.add_argument("--threads", type=int, default=1, help="torch threads in each process (1, as bench_parallel: on a "
                    "shared CPU more threads oversubscribe the cores)")
    # the children's own arguments
    ap.add_argument("--child", choices=("compile", "window"), help=argparse.SUPPRESS)
    ap.add_argument("--lanes-n", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--dtype", default="fp32", help=argparse.SUPPRESS)
    ap.add_argument("--start-folder", default=None, help=argparse.SUPPRESS)
    return ap


def main() -> None:
    a = parser().parse_args()
    if importlib.util.find_spec("pbr") is None:  # a bare GPU machine: the checkout, not installed
        sys.path.insert(0, str(HERE.parent))
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (str(HERE.parent), os.environ.get("PYTHONPATH"))))
    import torch

    a.device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if a.child:
        return child(a)
    exit_on_sigterm()  # the MPS daemon it started quits
    # Every list of counts read now: a typo found after the baseline (or the MPS daemon's start) costs
    # the device time spent before it.
    for flag in ("lanes", "processes", "mps_processes"):
        text = getattr(a, flag)
        if not all(k.strip().isdigit() and int(k) > 0 for k in text.split(",")):
            sys.exit(f"--{flag.replace('_', '-')} {text}: give positive whole numbers, comma separated (e.g. 1,2,4)")
    a.lanes = [int(k) for k in a.lanes.split(",")]
    if a.quick:
        a.lanes = [n for n in a.lanes if n <= 4] or [1, 2]
        a.steps, a.repeats, a.warmup, a.window, a.proc_warmup = 2, 3, 1, 1.5, 25
        a.processes, a.mps_processes = "2", "2"
    routes = a.routes.split(",")
    formats = list(dict.fromkeys(a.process_formats.split(",")))  # in the order given, each once
    if set(formats) - FORMATS:
        sys.exit(f"--process-formats: unknown {sorted(set(formats) - FORMATS)}; choose from {','.join(sorted(FORMATS))}")
    unknown = set(routes) - set(ROUTES)
    if unknown:
        sys.exit(f"--routes: unknown {sorted(unknown)}; choose from {','.join(ROUTES)}")
    torch.set_num_threads(a.threads)
    r = Routes(a)
    print(f"# bench_routes: {r.meta['machine']}, width {a.width}, batch {a.batch} + {a.batch} replay, budget "
          f"{a.seconds:.0f} s, out {r.out}\n# img/s = current-task images a second; runs/h = {r.meta['runs_per_hour']}",
          flush=True)
    cuda, cpu_tiny = r.dev.type == "cuda", r.dev.type == "cpu" and a.width < 20
    r.base = r.in_process("baseline", "fp32 eager, one run", lambda: single_step(a, r.dev))
    best = None
    if "lanes-bf16" in routes:
        try:
            got = autocast_reaches_convs(a, r.dev)
            r.record("lanes-bf16", "autocast check", 2, status="info",
                     note=f"under torch.autocast(bf16) a laned forward's convolutions get {got} inputs; "
                          "the bf16 rows cast by hand (Lanes' compute_dtype)")
        except Exception as e:  # noqa: BLE001 - a diagnostic only
            r.record("lanes-bf16", "autocast check", 2, status="failed", note=f"{type(e).__name__}: {e}"[:200])
    for route, dtype in (("lanes", "fp32"), ("lanes-bf16", "bf16")):
        if route in routes:
            b = r.lanes_sweep(route, dtype)
            best = b if b and (best is None or b[0] > best[0]) else best
    if "compile" in routes:
        if r.dev.type == "cpu" and (a.quick or a.width < 8):
            r.record("compile", "reduce-overhead", status="skipped", note="CPU smoke: compiling takes minutes, and "
                     "torch 2.14's CPU kernels crash at width 4 (docs/benchmarks.md)")
        else:
            r.compile_child("reduce-overhead, one run", 0)
            n, dtype = (best[1], best[2]) if best else (max(a.lanes), "fp32")
            r.compile_child(f"reduce-overhead, lanes {dtype}", n, dtype)
    if "processes" in routes:
        for n in (int(k) for k in a.processes.split(",")):
            for fmt in formats:
                r.windows("processes", n, fmt=fmt)
    if "lanes-data" in routes:
        r.lanes_sweep("lanes-data", "fp32", data="per-lane")
    if "lanes-data-batched" in routes:
        r.lanes_sweep("lanes-data-batched", "fp32", data="batched")
    if "lockstep" in routes:
        r.lockstep()
    best_n = best[1] if best else max(a.lanes)
    if "lanes-processes" in routes:
        for n in (2, 4) if not a.quick else (2,):
            r.windows("lanes-processes", n, n_lanes=best_n)
    def under_mps(route, windows):
        from stages.runtime import mps

        with mps.daemon() as (env, why):
            if env is None:
                r.record(route, "", status="skipped", note=why)
            else:
                windows(env)

    def mps_rows(env):
        for n in (int(k) for k in a.mps_processes.split(",")):
            for fmt in formats:
                r.windows("mps", n, env=env, fmt=fmt)
        if "lanes-processes" in routes:  # lanes under MPS: with the route they extend
            r.windows("mps", 4, n_lanes=best_n, env=env)

    def mps_graphs_rows(env):
        for n in (int(k) for k in a.mps_processes.split(",")):
            for fmt in formats:
                r.windows("mps-graphs", n, env=env, graphs=True, fmt=fmt)

    for route in ("mps", "graphs-processes", "mps-graphs"):
        if route in routes and not cuda:
            r.record(route, "", status="skipped", note="CUDA graphs and MPS are CUDA's")
        elif route == "mps" and route in routes:
            under_mps("mps", mps_rows)
        elif route == "graphs-processes" and route in routes:
            for n in (int(k) for k in a.processes.split(",")):
                for fmt in formats:
                    r.windows(route, n, graphs=True, fmt=fmt)
        elif route == "mps-graphs" and route in routes:
            under_mps(route, mps_graphs_rows)
    if "lanes-cl" in routes:
        if cpu_tiny:
            r.record("lanes-cl", "fp32/bf16", status="skipped",
                     note="channels_last on a CPU below width 20 is pathologically slow (docs/benchmarks.md)")
        else:
            for dtype in ("fp32", "bf16"):
                r.lanes_sweep("lanes-cl", dtype, cl=True)
    if "cudnn-benchmark" in routes and cuda:
        if best:
            torch.backends.cudnn.benchmark = True
            r.in_process("cudnn-benchmark", best[2], lambda: laned_step(a, r.dev, best[1], best[2]), lanes=best[1])
            torch.backends.cudnn.benchmark = False
        else:  # a row all the same: an absent one reads as a route forgotten
            r.record("cudnn-benchmark", "-", status="skipped",
                     note="it times the best eager lanes: give lanes or lanes-bf16 in --routes too (or none of them ran)")
    print(f"# wrote {r.out / 'routes.json'} and {r.out / 'routes.md'}; {a.seconds - r.left():.0f} s spent", flush=True)


if __name__ == "__main__":
    main()
