"""The JIT build module on a machine without a GPU: reasons instead of crashes, and ptxas parsing."""

import shutil

import pytest
import torch

from sdbench import ext, registry
from sdbench.errors import SdbenchError
from sdbench.measure import tools

NO_CUDA = not torch.cuda.is_available()

# Captured from `nvcc -arch=sm_90 --ptxas-options=-v` (13.0) on an early csrc/fused.cu (one kernel spilled), trimmed.
PTXAS_SAMPLE = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_ZN7sdbench40_GLOBAL__N__69ce7fa1_8_fused_cu_59e75c8b23fused_replicated_kernelIlEEvNS_3dev13BallotLengthsIT_EEPKcPcPllll' for 'sm_90'
ptxas info    : Function properties for _ZN7sdbench40_GLOBAL__N__69ce7fa1_8_fused_cu_59e75c8b23fused_replicated_kernelIlEEvNS_3dev13BallotLengthsIT_EEPKcPcPllll
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 64 registers, used 1 barriers, 256 bytes smem
ptxas info    : Compile time = 52.557 ms
ptxas info    : Compiling entry function '_ZN7sdbench40_GLOBAL__N__69ce7fa1_8_fused_cu_59e75c8b24fused_cooperative_kernelIiEEvNS_3dev13BallotLengthsIT_EEPKcPcPlS9_lll' for 'sm_90'
ptxas info    : Function properties for _ZN7sdbench40_GLOBAL__N__69ce7fa1_8_fused_cu_59e75c8b24fused_cooperative_kernelIiEEvNS_3dev13BallotLengthsIT_EEPKcPcPlS9_lll
    24 bytes stack frame, 36 bytes spill stores, 36 bytes spill loads
ptxas info    : Used 64 registers, used 1 barriers, 24 bytes cumulative stack size, 128 bytes smem
ptxas info    : Compiling entry function '_ZN7sdbench39_GLOBAL__N__58a16a09_7_misc_cu_61ce288712empty_kernelEv' for 'sm_90'
ptxas info    : Function properties for _ZN7sdbench39_GLOBAL__N__58a16a09_7_misc_cu_61ce288712empty_kernelEv
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 4 registers, used 0 barriers
"""


def test_parse_ptxas_reads_every_kernel():
    kernels = ext.parse_ptxas(PTXAS_SAMPLE, "fused.cu")
    assert [k["registers"] for k in kernels] == [64, 64, 4]
    assert [k["shared_bytes"] for k in kernels] == [256, 128, 0]
    assert [k["spill_store_bytes"] for k in kernels] == [0, 36, 0]
    assert [k["spill_load_bytes"] for k in kernels] == [0, 36, 0]
    assert [k["stack_bytes"] for k in kernels] == [0, 24, 0]
    assert all(k["arch"] == "sm_90" and k["source"] == "fused.cu" for k in kernels)


def test_parse_ptxas_names_kernels_readably():
    names = [k["kernel"] for k in ext.parse_ptxas(PTXAS_SAMPLE)]
    if names[0].startswith("_Z"):
        pytest.skip("no demangler (cu++filt / c++filt) on this machine")
    assert names == ["sdbench::fused_replicated_kernel<long>", "sdbench::fused_cooperative_kernel<int>",
                     "sdbench::empty_kernel"]


def test_short_kernel_name_drops_arguments_and_anonymous_namespace():
    demangled = "void sdbench::(anonymous namespace)::k<(int)4>(sdbench::dev::L<int>, char const*, long)"
    assert tools.short_kernel_name(demangled, keep_templates=True) == "sdbench::k<(int)4>"


def test_trim_build_error_keeps_error_lines():
    log = "\n".join(["[1/5] nvcc ... verify.cu"] * 50 + ["verify.cu(12): error: identifier \"x\" is undefined",
                                                         "      x = 1;", "1 error detected"])
    trimmed = ext.trim_build_error(log)
    assert 'error: identifier "x" is undefined' in trimmed
    assert "[1/5]" not in trimmed
    assert len(ext.trim_build_error(log * 100, max_chars=300)) <= 300


@pytest.mark.parametrize("arch, flag", [("9.0", "sm_90"), ("9.0a", "sm_90a"), ("8.0;9.0", "sm_80"),
                                        ("sm_90", "sm_90"), ("9.0+PTX", "sm_90")])
def test_arch_flag(arch, flag):
    assert ext.arch_flag(arch) == flag


def test_cache_root_honours_torch_extensions_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    assert ext.cache_root() == tmp_path
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR")
    assert "sdbench-extensions-" in ext.cache_root().name


@pytest.mark.skipif(not NO_CUDA, reason="checks the CPU-only behaviour")
def test_unavailable_reason_without_cuda_and_load_raises():
    reason = ext.unavailable_reason()
    assert reason is not None and ("CUDA torch not installed" in reason or "no CUDA device" in reason)
    with pytest.raises(SdbenchError, match="unavailable"):
        ext.load()


@pytest.mark.skipif(not NO_CUDA, reason="checks the CPU-only behaviour")
def test_cuda_implementations_registered_but_unavailable_without_cuda():
    cuda_impls = {(i.op, i.name): i for i in registry.implementations() if i.backend == "cuda"}
    expected = {("verify", "naive"), ("verify", "ballot"), ("pack", "pack_cuda_naive"), ("pack", "pack_cuda"),
                ("verify_pack", "fused_single_block"), ("verify_pack", "fused"),
                ("verify_pack", "ballot+pack_torch"), ("verify_pack", "ballot+pack_cuda")}
    assert expected <= set(cuda_impls)
    for key in expected:
        assert cuda_impls[key].unavailable_reason("cuda") is not None
        assert cuda_impls[key].unavailable_reason("cpu") is not None


def test_registry_flags_describe_the_kernels():
    impls = {(i.op, i.name): i for i in registry.implementations() if i.backend == "cuda"}
    assert impls[("pack", "pack_cuda_naive")].sync and impls[("verify_pack", "ballot+pack_torch")].sync
    assert not impls[("pack", "pack_cuda")].sync and not impls[("verify_pack", "fused")].sync
    from sdbench.ops.workload import VerifyConfig
    single = impls[("verify_pack", "fused_single_block")]
    assert single.supports(VerifyConfig(33, 8, kv_dim=8)) is not None
    assert single.supports(VerifyConfig(32, 8, kv_dim=8)) is None
    assert impls[("verify_pack", "fused")].supports(VerifyConfig(4096, 8, kv_dim=8)) is None


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_embeds_cxx_runtime_spots_a_static_libstdcxx():
    assert ext.embeds_cxx_runtime("g++ -static-libstdc++")
    assert not ext.embeds_cxx_runtime("g++")
