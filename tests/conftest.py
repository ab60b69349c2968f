"""Capability-based skipping: GPU tests need an sm_90 device, nvcc tests need nvcc on PATH."""
import shutil

import pytest
import torch


def _has_sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs an sm_90 (Hopper) CUDA device")
    skip_nvcc = pytest.mark.skip(reason="needs nvcc on PATH")
    has_gpu = _has_sm90()
    has_nvcc = shutil.which("nvcc") is not None
    for item in items:
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(skip_gpu)
        if "nvcc" in item.keywords and not has_nvcc:
            item.add_marker(skip_nvcc)
