"""The pipeline: params, files, DVC outputs, MLflow and the `pbr` CLI. Calls into `pbr/`."""
