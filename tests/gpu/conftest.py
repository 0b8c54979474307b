"""The GPU tests run only where they can: selected (-m gpu) on a host without
a CUDA device, they fail at once instead of skipping quietly."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def cuda_device():
    import torch

    if not torch.cuda.is_available():
        pytest.fail("the gpu tests need a CUDA device (run them with ci/gpu-vllm-check.sh on a GPU host)")
    return torch.cuda.get_device_name(0)
