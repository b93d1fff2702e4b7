"""tests/conftest.py's markers: GPU tests skip without CUDA, and a test marked `alone` (it compares GPU times)
skips where other pytest-xdist workers share the GPU, and runs where it has the GPU to itself."""

import pytest

from tests import conftest


class Item:
    def __init__(self, path, *markers):
        self.fspath = path
        self.keywords = {marker: True for marker in markers}
        self.skip_reasons = []

    def add_marker(self, marker):
        self.keywords[marker.name] = True
        if marker.name == "skip":
            self.skip_reasons.append(marker.kwargs["reason"])


def _collect(monkeypatch, workers, has_cuda):
    monkeypatch.setattr(conftest, "HAS_CUDA", has_cuda)
    if workers is None:
        monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    else:
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(workers))
    items = [Item("/r/tests/gpu/test_t.py", "alone"), Item("/r/tests/gpu/test_t.py"), Item("/r/tests/test_c.py")]
    conftest.pytest_collection_modifyitems(None, items)
    return items


@pytest.mark.parametrize("workers", [None, 1])
def test_an_alone_test_runs_with_the_gpu_to_itself(monkeypatch, workers):
    alone, gpu, cpu = _collect(monkeypatch, workers, has_cuda=True)
    assert "gpu" in alone.keywords and "gpu" in gpu.keywords and "gpu" not in cpu.keywords
    assert alone.skip_reasons == gpu.skip_reasons == cpu.skip_reasons == []


def test_an_alone_test_skips_beside_other_workers_and_says_why(monkeypatch):
    alone, gpu, cpu = _collect(monkeypatch, 4, has_cuda=True)
    assert len(alone.skip_reasons) == 1 and "4 pytest-xdist workers" in alone.skip_reasons[0]
    assert gpu.skip_reasons == cpu.skip_reasons == []


def test_without_cuda_every_gpu_test_skips_for_that_reason_alone(monkeypatch):
    alone, gpu, cpu = _collect(monkeypatch, 4, has_cuda=False)
    assert alone.skip_reasons == gpu.skip_reasons and len(gpu.skip_reasons) == 1 and "CUDA" in gpu.skip_reasons[0]
    assert cpu.skip_reasons == []
