"""`sdbench profile` on a GPU: every tool that works here gives per-kernel times and the decomposition.

nsys and ncu tests skip (with the reason) where the tool is absent or cannot run on this machine.
"""

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from sdbench import registry
from sdbench.cli import app
from sdbench.commands import profile
from sdbench.commands.profile import ProfileRequest, ToolFailed
from sdbench.ops.workload import VerifyConfig

SMALL = VerifyConfig(batch_size=32, gamma=128, alpha=0.9)
FAST = {"warmup": 3, "iters": 30, "profiled_iters": 5}


def _cuda_impl() -> str:
    """A custom-kernel verify implementation available here (skip when the extension is not built)."""
    for impl in registry.implementations("verify"):
        if impl.backend == "cuda" and impl.unavailable_reason("cuda", SMALL) is None:
            return impl.name
    pytest.skip("no backend=cuda verify implementation is available here (see `sdbench doctor`)")


def _run(tmp_path, impls, tool):
    return profile.run_profile(ProfileRequest(op="verify", impls=tuple(impls), config=SMALL, tool=tool,
                                              out_dir=str(tmp_path), **FAST))


def _check_decomposition(impl_profile) -> None:
    assert impl_profile.error is None, impl_profile.error
    assert impl_profile.kernels, "no kernels recorded"
    assert all(kernel.gpu_us > 0 for kernel in impl_profile.kernels)
    assert 0 < impl_profile.gpu_us < impl_profile.wall_us  # a call's wall includes its kernels and their launch
    assert impl_profile.launch_overhead_us > 0


@pytest.mark.parametrize("which", ["torch_eager", "custom"])
def test_torch_tool_gives_nonzero_kernel_times(tmp_path, which):
    name = "torch_eager" if which == "torch_eager" else _cuda_impl()
    report = _run(tmp_path, [name], "torch")
    (impl_profile,) = report.impls
    assert impl_profile.timing_tool == "torch"
    _check_decomposition(impl_profile)
    rows = pq.read_table(report.parquet_path).to_pylist()
    assert any(row["row"] == "kernel" and row["kernel_gpu_us"] > 0 for row in rows)


def test_torch_eager_launches_several_kernels_per_call(tmp_path):
    (impl_profile,) = _run(tmp_path, ["torch_eager"], "torch").impls
    assert impl_profile.launches_per_iter >= 3  # eq / any / argmax / where ... (~7)


def test_nsys_tool(tmp_path):
    reason = profile.tool_unavailable("nsys")
    if reason is not None:
        pytest.skip(f"nsys cannot run here: {reason}")
    try:
        report = _run(tmp_path, ["torch_eager"], "nsys")
    except ToolFailed as err:
        pytest.skip(f"nsys is installed but cannot write reports here: {err}")
    (impl_profile,) = report.impls
    assert impl_profile.timing_tool == "nsys"
    _check_decomposition(impl_profile)
    assert list(report.reports_dir.glob("*.nsys-rep"))


def test_ncu_tool_reads_warp_efficiency(tmp_path):
    reason = profile.tool_unavailable("ncu")
    if reason is not None:
        pytest.skip(f"ncu cannot run here: {reason}")
    try:
        report = _run(tmp_path, ["torch_eager"], "ncu")
    except ToolFailed as err:
        if "ERR_NVGPUCTRPERM" in str(err):
            pytest.skip(str(err))
        raise
    (impl_profile,) = report.impls
    assert impl_profile.counters and impl_profile.timing_tool == "ncu"
    ratios = [k.metrics.get("smsp__thread_inst_executed_per_inst_executed.ratio") for k in impl_profile.counters]
    assert any(ratio is not None and 0 < ratio <= 32 for ratio in ratios)


def test_auto_uses_what_works_and_explains_the_rest(tmp_path):
    report = _run(tmp_path, ["torch_eager"], "auto")
    assert report.choice.timing in ("nsys", "torch", "ncu")
    (impl_profile,) = report.impls
    _check_decomposition(impl_profile)
    used = {report.choice.timing} | ({"ncu"} if report.choice.counters else set())
    assert {tool for tool, _ in report.choice.skipped} | used >= {"nsys", "ncu", "torch"}


def test_cli_prints_the_decomposition(tmp_path):
    result = CliRunner().invoke(app, ["profile", "--impl", "torch_eager", "--tool", "torch", "--b", "4", "--gamma", "8",
                                      "--iters", "20", "--warmup", "3", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "launch overhead" in result.output and "torch_eager" in result.output
    assert list(tmp_path.glob("profile-*/profile.parquet"))
