"""Finding the NVIDIA tools and reading their output, from fake directory trees and captured texts."""

import os
import stat
from pathlib import Path

import pytest

from sdbench.measure import tools

# `nsys stats --report cuda_gpu_kern_sum --format csv ballot.nsys-rep` for torch_eager verify over
# 10 calls at b=32, γ=128 (names as nsys prints them: templates kept, parameters as T1, T2...).
NSYS_KERN_SUM = """\
Generating SQLite file /tmp/sdbench/profile-x/torch_eager.sqlite from /tmp/sdbench/profile-x/torch_eager.nsys-rep
Processing [/tmp/sdbench/profile-x/torch_eager.sqlite] with [/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/reports/cuda_gpu_kern_sum.py]...

 ** CUDA GPU Kernel Summary (cuda_gpu_kern_sum):

Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Name
38.6,52480,20,2624.0,2608.0,2560,2752,55.1,"void at::native::reduce_kernel<(int)512, (int)1, at::native::ReduceOp<bool, at::native::func_wrapper_t<bool, at::native::or_kernel_cuda(at::TensorIterator &)::[lambda(bool, bool) (instance 1)]>, unsigned int, bool, (int)4, (int)4>>(T3)"
24.1,32768,10,3276.8,3264.0,3200,3392,58.3,"void at::native::elementwise_kernel<(int)128, (int)2, void at::native::gpu_kernel_impl_nocast<at::native::CompareEqFunctor<long>>(at::TensorIteratorBase &, const T1 &)::[lambda(int) (instance 1)]>(int, T3)"
19.8,26912,10,2691.2,2688.0,2656,2752,28.7,"void at::native::vectorized_elementwise_kernel<(int)4, at::native::BitwiseNotFunctor<bool>, std::array<char *, (unsigned long)2>>(int, T2, T3)"
17.5,23808,10,2380.8,2368.0,2336,2464,37.1,"void at::native::index_elementwise_kernel<(int)128, (int)4, void at::native::gpu_index_kernel<void at::native::index_kernel_impl<at::native::OpaqueType<(int)8>>(at::TensorIteratorBase &, c10::ArrayRef<long>, c10::ArrayRef<long>)::[lambda(char *, const char *, long) (instance 1)]>(at::TensorIteratorBase &, c10::ArrayRef<long>, c10::ArrayRef<long>, const T1 &, bool)::[lambda(int) (instance 1)]>(long, T3)"
"""

NSYS_NO_KERNELS = """\
Processing [rep.sqlite] with [/opt/nvidia/nsight-systems/2025.3.1/host-linux-x64/reports/cuda_gpu_kern_sum.py]...
SKIPPED: rep.sqlite does not contain CUDA kernel data.
"""

# `ncu --import naive.ncu-rep --csv --page details --print-units base`: two calls of a naive
# thread-per-sequence verify and one fill kernel.
_NCU_HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
               '"Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def _ncu_row(launch_id, kernel, metric, unit, value, block="(256, 1, 1)", grid="(1, 1, 1)"):
    return (f'"{launch_id}","48213","python3","127.0.0.1","{kernel}","1","7","{block}","{grid}","0","9.0",'
            f'"Command line profiler metrics","{metric}","{unit}","{value}"')


NAIVE = "verify_naive_kernel(const long *, const long *, long *, bool *, long *, int, int)"
FILL = "void at::native::vectorized_elementwise_kernel<(int)4, at::native::FillFunctor<long>, std::array<char *, (unsigned long)1>>(int, T2, T3)"
NCU_DETAILS = "\n".join([
    "==PROF== Connected to process 48213 (/usr/bin/python3.12)",
    _NCU_HEADER,
    _ncu_row(0, NAIVE, "dram__throughput.avg.pct_of_peak_sustained_elapsed", "%", "0.21"),
    _ncu_row(0, NAIVE, "gpu__time_duration.sum", "nsecond", "26,144"),
    _ncu_row(0, NAIVE, "sm__warps_active.avg.pct_of_peak_sustained_active", "%", "12.48"),
    _ncu_row(0, NAIVE, "smsp__sass_average_branch_targets_threads_uniform.pct", "%", "61.02"),
    _ncu_row(0, NAIVE, "smsp__thread_inst_executed_per_inst_executed.ratio", "", "4.86"),
    _ncu_row(1, FILL, "gpu__time_duration.sum", "usecond", "1.28", block="(128, 1, 1)", grid="(1, 1, 1)"),
    _ncu_row(1, FILL, "smsp__thread_inst_executed_per_inst_executed.ratio", "", "32"),
    _ncu_row(2, NAIVE, "dram__throughput.avg.pct_of_peak_sustained_elapsed", "%", "0.19"),
    _ncu_row(2, NAIVE, "gpu__time_duration.sum", "nsecond", "25,856"),
    _ncu_row(2, NAIVE, "sm__warps_active.avg.pct_of_peak_sustained_active", "%", "12.52"),
    _ncu_row(2, NAIVE, "smsp__sass_average_branch_targets_threads_uniform.pct", "%", "60.98"),
    _ncu_row(2, NAIVE, "smsp__thread_inst_executed_per_inst_executed.ratio", "", "n/a"),
    "==PROF== Disconnected from process 48213",
])

# The same counters on ncu's raw page: one row per launch, a units row second.
NCU_RAW = "\n".join([
    '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
    '"Device","CC","gpu__time_duration.sum","smsp__thread_inst_executed_per_inst_executed.ratio"',
    '"","","","","","","","","","","","msecond",""',
    f'"0","48213","python3","127.0.0.1","{NAIVE}","1","7","(256, 1, 1)","(1, 1, 1)","0","9.0","0.026144","4.86"',
])

LDD_MISSING = """\
\tlinux-vdso.so.1 (0x00007ffd6b5f2000)
\tlibdw.so.1 => not found
\tlibpthread.so.0 => /lib/x86_64-linux-gnu/libpthread.so.0 (0x00007f1c2a9c1000)
\tlibelf.so.1 => not found
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f1c2a600000)
"""

NVIDIA_PARAMS = """\
ResmanDebugLevel: 4294967295
RmLogonRC: 1
EnableMSI: 1
RmProfilingAdminOnly: 1
"""


# --- parsing -----------------------------------------------------------------------------------
def test_nsys_kern_sum_rows_and_quoted_names():
    kernels = tools.parse_nsys_kern_sum(NSYS_KERN_SUM)
    assert len(kernels) == 4
    reduce = kernels[0]
    assert reduce.name.startswith("void at::native::reduce_kernel<(int)512, (int)1,")  # commas inside quotes
    assert (reduce.total_ns, reduce.instances, reduce.avg_ns, reduce.med_ns) == (52480.0, 20, 2624.0, 2608.0)
    assert kernels[1].total_ns == 32768.0 and kernels[1].instances == 10


def test_nsys_kern_sum_without_kernels_is_empty():
    assert tools.parse_nsys_kern_sum(NSYS_NO_KERNELS) == []
    assert tools.parse_nsys_kern_sum("") == []


def test_nsys_kern_sum_old_header_without_median():
    text = ("Time(%),Total Time (ns),Instances,Average,Minimum,Maximum,StdDev,Name\n"
            "100.0,1900,1,1900.0,1900,1900,0.0,verify_ballot_kernel\n")
    (kernel,) = tools.parse_nsys_kern_sum(text)
    assert kernel.med_ns == kernel.avg_ns == 1900.0


def test_ncu_details_groups_metrics_per_launch_and_converts_times_to_ns():
    launches = tools.parse_ncu_csv(NCU_DETAILS)
    assert [launch.launch_id for launch in launches] == [0, 1, 2]
    first = launches[0]
    assert first.kernel == NAIVE and first.block_size == "(256, 1, 1)"
    assert first.metrics["gpu__time_duration.sum"] == 26144.0  # "26,144" nsecond
    assert first.metrics["smsp__thread_inst_executed_per_inst_executed.ratio"] == 4.86
    assert launches[1].metrics["gpu__time_duration.sum"] == pytest.approx(1280.0)  # 1.28 usecond
    assert "smsp__thread_inst_executed_per_inst_executed.ratio" not in launches[2].metrics  # n/a is absent


def test_ncu_raw_page_with_units_row():
    (launch,) = tools.parse_ncu_csv(NCU_RAW)
    assert launch.kernel == NAIVE
    assert launch.metrics["gpu__time_duration.sum"] == pytest.approx(26144.0)
    assert launch.metrics["smsp__thread_inst_executed_per_inst_executed.ratio"] == 4.86


def test_ncu_output_without_csv_is_empty():
    text = ("==PROF== Connected to process 1\n==ERROR== ERR_NVGPUCTRPERM - The user does not have permission "
            "to access NVIDIA GPU Performance Counters on the target device 0.\n")
    assert tools.parse_ncu_csv(text) == []
    assert tools.is_ncu_permission_error(text)


@pytest.mark.parametrize("tool, text, version", [
    ("nvcc", "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, V13.0.88\n", "13.0"),
    ("nsys", "NVIDIA Nsight Systems version 2025.3.1.90-253135822126v0\n", "2025.3.1.90"),
    ("ncu", "NVIDIA (R) Nsight Compute Command Line Profiler\nCopyright (c) 2018-2025 NVIDIA Corporation\n"
            "Version 2025.3.1.0 (build 36398880) (public-release)\n", "2025.3.1.0"),
    ("compute-sanitizer", "NVIDIA (R) Compute Sanitizer\nVersion 2025.3.0.0 (public-release)\n", "2025.3.0.0"),
    ("nsys", "bash: nsys: command not found\n", None),
])
def test_versions(tool, text, version):
    assert tools.parse_version(tool, text) == version


@pytest.mark.parametrize("name, short", [
    ("void at::native::reduce_kernel<(int)512, (int)1, at::native::ReduceOp<bool>>(T3)", "reduce_kernel"),
    (NAIVE, "verify_naive_kernel"),
    ("void sdbench::verify_ballot<(int)32>(const long *, int)", "verify_ballot"),
    ("triton_poi_fused_eq_0", "triton_poi_fused_eq_0"),
    ("Memcpy DtoD (Device -> Device)", "Memcpy DtoD"),
])
def test_short_kernel_names(name, short):
    assert tools.short_kernel_name(name) == short


# --- discovery ---------------------------------------------------------------------------------
def _executable(path: Path, text: str = "#!/bin/sh\necho fake\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def test_nsys_found_off_path_in_the_nsight_compute_tree_newest_first(tmp_path):
    old = _executable(tmp_path / "opt/nvidia/nsight-compute/2024.1.1/host/target-linux-x64/nsys")
    new = _executable(tmp_path / "opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys")
    info = tools.find_tool("nsys", env={"PATH": str(tmp_path / "empty")}, root=tmp_path)
    assert info.path == str(new) and not info.on_path
    assert str(old.parent) in info.searched


def test_nsys_standalone_install_beats_the_nsight_compute_copy(tmp_path):
    _executable(tmp_path / "opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys")
    standalone = _executable(tmp_path / "opt/nvidia/nsight-systems/2025.5.1/bin/nsys")
    info = tools.find_tool("nsys", env={"PATH": ""}, root=tmp_path)
    assert info.path == str(standalone)


def test_cuda_home_comes_before_the_filesystem_and_path_before_both(tmp_path):
    _executable(tmp_path / "usr/local/cuda-12.4/bin/nvcc")
    home = _executable(tmp_path / "toolkits/cuda-13.0/bin/nvcc")
    env = {"PATH": "", "CUDA_HOME": str(tmp_path / "toolkits/cuda-13.0")}
    assert tools.find_tool("nvcc", env=env, root=tmp_path).path == str(home)
    on_path = _executable(tmp_path / "bin/nvcc")
    info = tools.find_tool("nvcc", env={**env, "PATH": str(on_path.parent)}, root=tmp_path)
    assert info.path == str(on_path) and info.on_path


def test_cuda_versions_sort_numerically(tmp_path):
    for version in ("12.4", "12.10", "12.9"):
        _executable(tmp_path / f"usr/local/cuda-{version}/bin/nvcc")
    info = tools.find_tool("nvcc", env={"PATH": ""}, root=tmp_path)
    assert info.path == str(tmp_path / "usr/local/cuda-12.10/bin/nvcc")


def test_missing_tool_lists_where_it_looked(tmp_path):
    (tmp_path / "usr/local/cuda-13.0/bin").mkdir(parents=True)
    info = tools.find_tool("ncu", env={"PATH": ""}, root=tmp_path)
    assert not info.found and info.searched[0] == "PATH"
    assert str(tmp_path / "usr/local/cuda-13.0/bin") in info.searched


def test_non_executable_file_is_not_a_tool(tmp_path):
    path = tmp_path / "usr/local/cuda/bin/ncu"
    path.parent.mkdir(parents=True)
    path.write_text("not executable")
    assert not tools.find_tool("ncu", env={"PATH": ""}, root=tmp_path).found


def test_probe_reads_the_version(tmp_path):
    _executable(tmp_path / "opt/nvidia/nsight-systems/2025.3.1/bin/nsys",
                "#!/bin/sh\necho 'NVIDIA Nsight Systems version 2025.3.1.90-253135822126v0'\n")
    info = tools.probe_tool("nsys", env={"PATH": os.environ.get("PATH", "")}, root=tmp_path)
    assert info.version == "2025.3.1.90" and info.error is None


def test_toolkit_root_behind_a_wrapper_script(tmp_path):
    toolkit = tmp_path / "usr/local/cuda-13.0"
    _executable(toolkit / "bin/nvcc")
    (toolkit / "include").mkdir()
    (toolkit / "include/cuda_runtime.h").write_text("")
    wrapper = _executable(tmp_path / "usr/local/bin/nvcc", f'#!/bin/sh\nexec {toolkit}/bin/nvcc "$@"\n')
    assert tools.cuda_toolkit_root(str(wrapper)) == toolkit
    assert tools.cuda_toolkit_root(str(toolkit / "bin/nvcc")) == toolkit


# --- the nsys importer trap and ncu permissions --------------------------------------------------
def test_importer_found_beside_the_h100_hosts_nsys(tmp_path):
    nsys = _executable(tmp_path / "nsight-compute/2025.3.1/host/target-linux-x64/nsys")
    importer = _executable(tmp_path / "nsight-compute/2025.3.1/host/linux-desktop-glibc_2_11_3-x64/QdstrmImporter")
    assert tools.find_qdstrm_importer(nsys) == importer


def test_ldd_missing_libraries_and_the_fix():
    missing = tools.missing_libraries(LDD_MISSING)
    assert missing == ["libdw.so.1", "libelf.so.1"]
    fix = tools.importer_fix(missing, libs_dir=Path("/home/me/.local/nsys-libs"))
    assert "apt-get download libdw1 libelf1" in fix
    assert "export LD_LIBRARY_PATH=/home/me/.local/nsys-libs/usr/lib/x86_64-linux-gnu:$LD_LIBRARY_PATH" in fix


def test_nsys_env_adds_the_unpacked_libraries_only_when_present(tmp_path):
    assert "LD_LIBRARY_PATH" not in tools.nsys_env({"PATH": "/bin"}, home_libs=tmp_path / "absent")
    (tmp_path / "libs" / tools.NSYS_LIBS_SUBDIR).mkdir(parents=True)
    env = tools.nsys_env({"LD_LIBRARY_PATH": "/opt/x"}, home_libs=tmp_path / "libs")
    assert env["LD_LIBRARY_PATH"] == f"{tmp_path / 'libs' / tools.NSYS_LIBS_SUBDIR}:/opt/x"


def test_report_problem_names_the_importer_when_only_a_qdstrm_is_left(tmp_path):
    (tmp_path / "rep.qdstrm").write_text("")
    output = "Importer error status: An unknown error occurred.\nUnable to retrieve the importer version\n"
    assert "QdstrmImporter failed" in tools.nsys_report_problem(output, tmp_path / "rep", 0)
    (tmp_path / "rep.nsys-rep").write_text("")
    assert tools.nsys_report_problem("", tmp_path / "rep", 0) is None


@pytest.mark.parametrize("params, status, euid, readable", [
    (NVIDIA_PARAMS, "CapEff:\t0000000000000000\n", 1000, False),  # admin-only, plain user
    (NVIDIA_PARAMS, "CapEff:\t000001ffffffffff\n", 0, True),  # admin-only, full root
    (NVIDIA_PARAMS, "CapEff:\t00000000a80425fb\n", 0, False),  # container root: no CAP_SYS_ADMIN
    (NVIDIA_PARAMS.replace("AdminOnly: 1", "AdminOnly: 0"), "CapEff:\t0\n", 1000, True),
    ("RestrictProfilingToAdminUsers: 1\n", None, 0, True),  # no status file: root counts
    ("EnableMSI: 1\n", None, 1000, None),  # the driver does not say
    (None, None, 1000, None),  # no driver
])
def test_counter_permission_from_driver_params(params, status, euid, readable):
    assert tools.counters_readable(params, status, euid) is readable


def test_importer_libraries_shipped_with_nsys_are_not_missing(tmp_path, monkeypatch):
    host = tmp_path / "nsight-compute/2025.3.1/host"
    nsys = _executable(host / "target-linux-x64/nsys")
    _executable(host / "linux-desktop-glibc_2_11_3-x64/QdstrmImporter")
    (host / "linux-desktop-glibc_2_11_3-x64/libelf.so.1").write_text("")  # shipped beside the importer
    monkeypatch.setattr(tools.shutil, "which", lambda name, path=None: "/usr/bin/ldd")
    monkeypatch.setattr(tools, "run_quietly", lambda argv, env=None, timeout=0: (0, LDD_MISSING))
    importer, missing = tools.importer_missing_libraries(str(nsys), env={})
    assert importer.name == "QdstrmImporter" and missing == ["libdw.so.1"]
