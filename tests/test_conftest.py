"""tests/conftest.py's markers: GPU tests skip without CUDA, and a test marked `alone` (it compares GPU times)
skips where other pytest-xdist workers share the GPU, and runs where it has the GPU to itself."""

import pytest

from tests import conftest


class Item:
    """What the hook reads of a pytest item: its path, keywords (marks and names) and marks."""

    def __init__(self, path, *markers, name="test_t"):
        self.fspath = path
        self.marks = set(markers)
        self.keywords = {name: True, **{marker: True for marker in markers}}
        self.skip_reasons = []

    def get_closest_marker(self, name):
        return name if name in self.marks else None

    def add_marker(self, marker):
        self.marks.add(marker.name)
        self.keywords[marker.name] = True
        if marker.name == "skip":
            self.skip_reasons.append(marker.kwargs["reason"])


def _collect(monkeypatch, workers, has_cuda, in_worker=True):
    monkeypatch.setattr(conftest, "HAS_CUDA", has_cuda)
    for name in ("PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_WORKER"):
        monkeypatch.delenv(name, raising=False)
    if workers is not None:
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(workers))
        if in_worker:
            monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    # the last: a test whose name (not its marks) says alone
    items = [Item("/r/tests/gpu/test_t.py", "alone"), Item("/r/tests/gpu/test_t.py"), Item("/r/tests/test_c.py"),
             Item("/r/tests/gpu/test_t.py", name="alone")]
    conftest.pytest_collection_modifyitems(None, items)
    return items[:3], items[3]


@pytest.mark.parametrize("workers", [None, 1])
def test_an_alone_test_runs_with_the_gpu_to_itself(monkeypatch, workers):
    (alone, gpu, cpu), _ = _collect(monkeypatch, workers, has_cuda=True)
    assert "gpu" in alone.keywords and "gpu" in gpu.keywords and "gpu" not in cpu.keywords
    assert alone.skip_reasons == gpu.skip_reasons == cpu.skip_reasons == []


def test_an_alone_test_skips_beside_other_workers_and_says_why(monkeypatch):
    (alone, gpu, cpu), named_alone = _collect(monkeypatch, 4, has_cuda=True)
    assert len(alone.skip_reasons) == 1 and "4 pytest-xdist workers" in alone.skip_reasons[0]
    assert gpu.skip_reasons == cpu.skip_reasons == named_alone.skip_reasons == []  # the mark, not a name, decides


def test_a_worker_count_inherited_by_a_serial_run_does_not_skip(monkeypatch):
    (alone, gpu, cpu), _ = _collect(monkeypatch, 4, has_cuda=True, in_worker=False)
    assert alone.skip_reasons == gpu.skip_reasons == cpu.skip_reasons == []


def test_without_cuda_every_gpu_test_skips_for_that_reason_alone(monkeypatch):
    (alone, gpu, cpu), _ = _collect(monkeypatch, 4, has_cuda=False)
    assert alone.skip_reasons == gpu.skip_reasons and len(gpu.skip_reasons) == 1 and "CUDA" in gpu.skip_reasons[0]
    assert cpu.skip_reasons == []
