"""Experiment management across runs: sweeps and their grids, the report and its figures, the
paper's numbers, the pre-registered confirmation, offline runs and their import."""
