"""PBR: Prior-free Balanced Replay for long-tailed continual learning (the library).

Tensors and arrays in, tensors and numbers out. Nothing here reads params.yaml,
chooses file paths on its own, or talks to MLflow: that is the job of `stages/`.
"""

__version__ = "0.1.0"
