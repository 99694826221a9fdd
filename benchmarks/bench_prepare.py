"""prepare on the real CIFAR-10 archive: seconds, peak memory, and task read throughput from the
shards against unpickling the raw batches.

    python benchmarks/bench_prepare.py [--root FOLDER]  (default: $PBR_DATA_DIR, else data/raw)
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from common import machine

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=os.environ.get("PBR_DATA_DIR") or str(ROOT / "data" / "raw"))
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    root = Path(a.root).resolve()  # the stage runs in a temporary folder: a relative path would point nowhere
    archive = root / "cifar-10-python.tar.gz"
    if not archive.is_file():
        sys.exit(f"skipped: {archive} not found (give --root or PBR_DATA_DIR)")
    print(f"# prepare on {archive}, {machine()}")
    with tempfile.TemporaryDirectory() as tmp:
        # JSON is YAML, and quotes the path whatever it holds (a comma, a colon).
        (Path(tmp) / "params.yaml").write_text(
            json.dumps({"data": {"dataset": "cifar10", "root": str(root), "download": False}}) + "\n")
        code = ("import resource, time, sys; sys.path.insert(0, %r); from stages.runtime.config import load_config;"
                "from stages.pipeline import prepare; t = time.perf_counter(); prepare.run(load_config('params.yaml'), "
                "log=lambda *a: None); print(time.perf_counter() - t, "
                "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)") % str(ROOT)
        times, peaks = [], []
        for _ in range(a.repeats):
            out = subprocess.run([sys.executable, "-c", code], cwd=tmp, capture_output=True, text=True)
            if out.returncode:
                sys.exit(f"prepare failed: {(out.stderr.strip().splitlines() or ['no output'])[-1]}")
            secs, peak = out.stdout.split()
            times.append(float(secs))
            peaks.append(int(peak))
        print(f"prepare (read archive, build stream, write shards): median {statistics.median(times):.2f} s, "
              f"peak RSS {max(peaks) / 1024:.0f} MB")

        sys.path.insert(0, str(ROOT))
        from pbr.data.shards import load_manifest, read_split

        prepared = Path(tmp) / "data" / "prepared"
        manifest = load_manifest(prepared)
        n = sum(manifest["task_train_counts"]) + sum(manifest["task_test_counts"])

        def read_all(verify: bool):
            for k in range(manifest["n_tasks"]):
                for split in ("train", "test"):
                    read_split(prepared, manifest, k, split, verify=verify)

        from common import rate

        shard_rate = rate(lambda: read_all(True), n, a.repeats)
        unverified_rate = rate(lambda: read_all(False), n, a.repeats)
    blobs = {}
    with tarfile.open(archive) as tar:  # decompression is not counted: only unpickling
        for m in tar:
            if m.isfile() and ("data_batch" in m.name or "test_batch" in m.name):
                blobs[m.name] = tar.extractfile(m).read()
    def unpickle_all():
        for b in blobs.values():
            pickle.loads(b, encoding="bytes")

    total = sum(len(pickle.loads(b, encoding="bytes")[b"labels"]) for b in blobs.values())  # also the warm-up
    pickle_rate = rate(unpickle_all, total, a.repeats)  # the median of --repeats, as the shards' rate
    print(f"read every task from shards (hash-checked): {shard_rate:,.0f} img/s; "
          f"without the hash check: {unverified_rate:,.0f} img/s")
    print(f"unpickle the raw batches (already decompressed): {pickle_rate:,.0f} img/s "
          f"-> shards {shard_rate / pickle_rate:.2f}x")


if __name__ == "__main__":
    main()
