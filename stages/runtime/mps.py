"""CUDA MPS for the runs of one sweep on one GPU.

Each run is its own process at batch 32 + 32, bound by kernel launches; without MPS the GPU
time-slices between processes and four saturate it. Under an MPS server their kernels run side by
side: on one H100, eight processes of the ER step trained 9,037 current-task img/s against 5,126 for
four without MPS in the same call (docs/gpu.md, Measured on an H100). The daemon here is a user's
own (its pipe and log in a temporary folder), serves only the processes given its pipe folder in
their environment, and quits when the sweep ends.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from typing import Iterator

from pbr.errors import UserError

CONTROL = "nvidia-cuda-mps-control"
PIPE = "CUDA_MPS_PIPE_DIRECTORY"
LOG = "CUDA_MPS_LOG_DIRECTORY"
MODES = ("auto", "mps", "off")


def start(folder: str) -> tuple[dict[str, str] | None, str]:
    """Start a control daemon with its pipe and log under `folder`: (the clients' env, why not)."""
    env = {PIPE: os.path.join(folder, "pipe"), LOG: os.path.join(folder, "log")}
    for d in env.values():
        os.makedirs(d, exist_ok=True)
    if shutil.which(CONTROL) is None:
        return None, f"{CONTROL} is not on PATH"
    try:
        p = subprocess.run([CONTROL, "-d"], env={**os.environ, **env}, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"{CONTROL} -d: {type(e).__name__}: {e}"
    if p.returncode != 0:
        return None, f"{CONTROL} -d exited {p.returncode}: {(p.stderr or p.stdout).strip()[:200]}"
    return env, ""


# Seconds a first CUDA client through the daemon may take, torch's import included: one process alone
# imports torch in seconds (on the H100's freshly started machine, five of twelve at once did within
# 16 s), and a hang spent its whole wait out of a device call's budget (120 s of bench_runs_gpu's 540)
# before the runs time-sliced. A false alarm costs a sweep MPS only (it says so; 4 runs at once).
CLIENT_TIMEOUT = 45


def serves(env: dict[str, str]) -> str:
    """Why a CUDA client cannot use the daemon, or "": a daemon that started may still refuse its
    clients (another user's server on the GPU, a compute mode that forbids it), and every run of the
    sweep would then fail at its first kernel. One client, before any run starts."""
    code = "import torch; x = torch.ones(1, device='cuda'); x.add_(1); torch.cuda.synchronize()"
    try:
        p = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                           timeout=CLIENT_TIMEOUT)
    except subprocess.TimeoutExpired:
        return f"a CUDA client through it did not finish within {CLIENT_TIMEOUT} s"
    except OSError as e:
        return f"a CUDA client through it did not start: {e}"
    if p.returncode != 0:
        last = (p.stderr or p.stdout).strip().splitlines()[-1:] or [f"exit {p.returncode}"]
        return f"it started, but a CUDA client through it failed: {last[0][:200]}"
    return ""


def stop(env: dict[str, str]) -> None:
    try:
        subprocess.run([CONTROL], input="quit\n", env={**os.environ, **env}, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return  # a daemon that will not quit leaves no output of ours unfinished
    # `quit` returns before the daemon has gone: give it a moment to take its pipe (and its log writes) away.
    deadline = time.time() + 10
    while time.time() < deadline and os.path.exists(os.path.join(env[PIPE], "control")):
        time.sleep(0.1)


@contextmanager
def daemon() -> Iterator[tuple[dict[str, str] | None, str]]:
    """A control daemon of our own for the block's duration: (the clients' env, why not), quit after."""
    # A daemon still writing its log as the folder goes must not turn a finished sweep into an error.
    with tempfile.TemporaryDirectory(prefix="pbr-mps-", ignore_cleanup_errors=True) as folder:
        try:
            env, why = start(folder)
            if env is not None:
                why = serves(env)
                if why:
                    stop(env)
                    env = None
        except BaseException:  # interrupted while starting: a daemon that forked off before must quit too
            stop({PIPE: os.path.join(folder, "pipe"), LOG: os.path.join(folder, "log")})
            raise
        try:
            yield env, why
        finally:
            if env is not None:
                stop(env)


def parse_mode(text: str) -> str:
    t = text.strip().lower()
    if t not in MODES:
        raise UserError(f"--gpu-share {text}: give auto (MPS where the runs use a CUDA GPU and it starts), mps "
                        "(MPS or stop) or off")
    return t


@contextmanager
def shared(mode: str, on_gpu: bool, log=print) -> Iterator[bool]:
    """While open, child processes started from here share the GPU through one MPS server (True),
    or run as before (False): `off`, runs not on a GPU, or `auto` where MPS does not start."""
    if mode == "off" or (mode == "auto" and not on_gpu):
        yield False
        return
    if not on_gpu:
        raise UserError("--gpu-share mps: the runs do not use a CUDA GPU (train.device, or no GPU here); "
                        "use --gpu-share auto or off")
    with daemon() as (env, why):
        if env is None:
            if mode == "mps":
                raise UserError(f"--gpu-share mps: MPS did not start ({why}); use --gpu-share off")
            log(f"--gpu-share auto: no MPS ({why}); the runs time-slice the GPU")
            yield False
            return
        before = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            yield True
        finally:
            for k, v in before.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def sharing(device) -> str:
    """How this process shares its device, for run.json and MLflow: mps or none."""
    return "mps" if getattr(device, "type", str(device)) == "cuda" and os.environ.get(PIPE) else "none"
