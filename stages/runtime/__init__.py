"""The plumbing every command uses: the validated config, paths, atomic artifacts, MLflow
tracking, resume stores, fault injection, threads, hardware defaults, progress, plots."""
