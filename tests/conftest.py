"""Test-wide setup: everything under tests/gpu/ is a GPU test and skips cleanly without CUDA."""

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device (run `make gpu-test` on a GPU machine)")
    for item in items:
        if "/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.gpu)
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)
