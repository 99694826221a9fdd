"""The pipeline: params, files, DVC outputs, MLflow and the `pbr` CLI (cli.py). Calls into `pbr/`.

pipeline/: the DVC stages; experiments/: sweeps, the report, confirmation, offline runs; runtime/:
the plumbing they share (config, paths, artifacts, tracking, resume, threads, hardware).
"""
