"""trace-kernels: NVFP4 kernels and TRACE rollout guidance for FP4 RL of MoE models.

Importing this package needs no GPU or CUDA driver; GPU pieces import lazily.
"""

__version__ = "0.1.0"
