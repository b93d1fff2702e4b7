"""`sdbench doctor`: the rules on hand-built facts, and the command on this (CPU) machine."""

import json
import time

import pytest
import torch
from typer.testing import CliRunner

from sdbench.cli import app
from sdbench.commands import doctor
from sdbench.commands.doctor import FAIL, PASS, WARN, Check, Facts, GpuInfo
from sdbench.measure.tools import ToolInfo

runner = CliRunner()

# A /proc/mounts of a cluster login node: local root, NFS home, Lustre scratch, a path with a space.
MOUNTS = r"""
/dev/nvme0n1p2 / ext4 rw,relatime 0 0
tmpfs /tmp tmpfs rw,nosuid,nodev 0 0
nas01:/export/home /home nfs4 rw,relatime,vers=4.2,rsize=1048576 0 0
10.1.0.5@o2ib:/scratch /scratch lustre rw,flock,lazystatfs 0 0
/dev/nvme1n1 /scratch/local ext4 rw,relatime 0 0
//fs/share /mnt/team\040share cifs rw,relatime 0 0
beegfs_nodev /beegfs beegfs rw,relatime 0 0
sshfs#me@box: /mnt/box fuse.sshfs rw,nosuid 0 0
"""

H100 = GpuInfo("NVIDIA H100 80GB HBM3", "9.0", 132, 79.1)


def _h100_facts(**changes) -> Facts:
    """The H100 host as GPU-HOST.md describes it, with every tool working."""
    facts = Facts(
        env={"PATH": "/usr/bin", "TORCH_CUDA_ARCH_LIST": "9.0"},
        torch_version="2.11.0+cu130", torch_cuda="13.0", gpu=H100, driver_version="580.159",
        tools={
            "nvcc": ToolInfo("nvcc", "/usr/local/cuda/bin/nvcc", "13.0", on_path=True),
            "nsys": ToolInfo("nsys", "/opt/nvidia/nsight-systems/2025.3.1/bin/nsys", "2025.3.1.90", on_path=True),
            "ncu": ToolInfo("ncu", "/usr/local/cuda/bin/ncu", "2025.3.1.0", on_path=True),
            "compute-sanitizer": ToolInfo("compute-sanitizer", "/usr/local/cuda/bin/compute-sanitizer", "2025.3.0.0",
                                          on_path=True),
        },
        ninja_version="1.11.1", extensions_dir="/tmp/sdbench-me/torch_extensions", mounts_text=MOUNTS,
        free_bytes=50 * 2**30, params_text="RmProfilingAdminOnly: 0\n", euid=1000, extension_known=True,
        impl_total=6,
    )
    for key, value in changes.items():
        setattr(facts, key, value)
    return facts


def _by_name(checks: list[Check]) -> dict[str, Check]:
    return {check.name: check for check in checks}


# --- JIT cache on a network filesystem ---------------------------------------------------------
@pytest.mark.parametrize("path, mount_point, fstype", [
    ("/home/me/.cache/torch_extensions", "/home", "nfs4"),
    ("/scratch/me/ext", "/scratch", "lustre"),
    ("/scratch/local/me/ext", "/scratch/local", "ext4"),  # the longer mount point wins
    ("/scratchpad/me", "/", "ext4"),  # a prefix of the name is not a parent folder
    ("/tmp/sdbench-me/torch_extensions", "/tmp", "tmpfs"),
    ("/mnt/team share/ext", "/mnt/team share", "cifs"),  # \040 decoded
    ("/home", "/home", "nfs4"),
])
def test_filesystem_of_uses_the_longest_mount_point(path, mount_point, fstype):
    _, found_mount, found_type = doctor.filesystem_of(path, MOUNTS)
    assert (found_mount, found_type) == (mount_point, fstype)


@pytest.mark.parametrize("fstype, network", [
    ("nfs", True), ("nfs4", True), ("cifs", True), ("lustre", True), ("gpfs", True), ("beegfs", True),
    ("fuse.sshfs", True), ("fuse.beegfs", True), ("ext4", False), ("xfs", False), ("tmpfs", False),
    ("overlay", False), ("fuse.portal", False),
])
def test_network_filesystem_types(fstype, network):
    assert doctor.is_network_filesystem(fstype) is network


def test_extensions_dir_on_nfs_warns_with_a_local_export():
    check = doctor.check_extensions_dir("/home/me/torch_extensions", True, MOUNTS)
    assert check.status == WARN and "nfs4" in check.detail
    assert check.exports and check.exports[0].startswith("export TORCH_EXTENSIONS_DIR=/tmp/")


def test_extensions_dir_resolved_through_a_symlink():
    # /tmp/ext looks local but is a symlink into the NFS home: the resolved path decides.
    check = doctor.check_extensions_dir("/tmp/ext", False, MOUNTS, real_path="/home/me/ext")
    assert check.status == WARN


def test_local_extensions_dir_passes():
    assert doctor.check_extensions_dir("/tmp/sdbench-me/torch_extensions", False, MOUNTS).status == PASS


# --- TORCH_CUDA_ARCH_LIST ----------------------------------------------------------------------
@pytest.mark.parametrize("value, status", [
    (None, WARN),  # unset on a GPU machine
    ("", WARN),
    ("9.0", PASS),
    ("9.0+PTX", PASS),
    ("9.0a", PASS),
    ("Hopper", PASS),  # torch's named arch: 9.0+PTX
    ("8.0;8.6;9.0", WARN),  # archs the device does not have: slow builds
    ("8.0 9.0", WARN),  # torch also splits on spaces
    ("8.0+PTX", WARN),  # runs (PTX JIT) but not the device's own
    ("8.6", FAIL),  # nothing runs on 9.0
    ("10.0", FAIL),
    ("9.0,8.0", FAIL),  # torch does not split on commas
    ("sm_90", FAIL),
])
def test_arch_list_against_an_sm90_device(value, status):
    check = doctor.check_arch_list(value, "9.0")
    assert check.status == status, check.detail
    if status != PASS:
        assert check.exports == ('export TORCH_CUDA_ARCH_LIST="9.0"',)


def test_arch_list_without_a_gpu_passes_and_recommends_nothing():
    assert doctor.check_arch_list(None, None).status == PASS
    assert doctor.check_arch_list("8.0;9.0", None).exports == ()


def test_sass_runs_within_its_major_version_only():
    (entry,), _ = doctor.parse_arch_list("8.0")
    assert entry.runs_on(8, 6) and not entry.runs_on(9, 0)


# --- nvcc against torch ------------------------------------------------------------------------
def test_nvcc_matching_torch_passes():
    status, detail, fix, exports = doctor.compare_nvcc_torch("13.0", "13.0")
    assert status == PASS and not exports


def test_nvcc_major_mismatch_warns_and_points_at_the_matching_toolkit():
    toolkits = [("/usr/local/cuda-12.4", "12.4.131"), ("/usr/local/cuda-13.0", "13.0.88")]
    status, detail, fix, exports = doctor.compare_nvcc_torch("12.4", "13.0", toolkits)
    assert status == WARN and "refuses" in detail
    assert exports == ("export CUDA_HOME=/usr/local/cuda-13.0", "export PATH=/usr/local/cuda-13.0/bin:$PATH")


def test_nvcc_minor_mismatch_warns_without_a_toolkit_to_offer():
    status, detail, fix, exports = doctor.compare_nvcc_torch("13.1", "13.0", [])
    assert status == WARN and "module load cuda/13.0" in fix and exports == ()


def test_nvcc_with_cpu_torch_passes():
    assert doctor.compare_nvcc_torch("13.0", None)[0] == PASS


def test_nvcc_off_path_warns_with_the_path_export():
    facts = _h100_facts()
    facts.tools["nvcc"] = ToolInfo("nvcc", "/usr/local/cuda-13.0/bin/nvcc", "13.0", on_path=False)
    check = doctor.check_nvcc(facts)
    assert check.status == WARN and "not on PATH" in check.detail
    assert "export PATH=/usr/local/cuda-13.0/bin:$PATH" in check.exports


def test_nvcc_missing_everywhere_warns():
    facts = _h100_facts()
    facts.tools["nvcc"] = ToolInfo("nvcc")
    assert doctor.check_nvcc(facts).status == WARN


# --- GPU, profilers, extension -----------------------------------------------------------------
def test_healthy_h100_host_has_no_failures():
    checks = doctor.diagnose(_h100_facts())
    assert doctor.exit_code(checks) == 0, [c for c in checks if c.status == FAIL]
    found = _by_name(checks)
    assert found["GPU"].status == PASS and "132 SMs" in found["GPU"].detail and "580.159" in found["GPU"].detail
    assert found["ncu"].status == PASS and found["nsys"].status == PASS


def test_cuda_home_that_is_not_a_toolkit_warns(tmp_path):
    facts = _h100_facts(env={"CUDA_HOME": str(tmp_path / "no-cuda-here")})
    check = doctor.check_cuda_home(facts)
    assert check.status == WARN and "not a CUDA toolkit" in check.detail


def test_cuda_home_is_not_a_warning_on_a_machine_without_a_gpu(monkeypatch):
    monkeypatch.setattr(doctor, "is_toolkit", lambda path: False)  # as on a CI machine with no toolkit
    facts = Facts(torch_version="2.13.0+cpu", impl_cpu=["torch_eager"], impl_total=6, env={})
    check = doctor.check_cuda_home(facts)
    assert check.status == PASS and "only needed" in check.detail


def test_no_gpu_is_a_warning_that_names_the_cpu_only_commands():
    facts = Facts(torch_version="2.13.0+cpu", impl_cpu=["torch_eager"], impl_total=6)
    check = doctor.check_cuda(facts)
    assert check.status == WARN
    summary = doctor.cpu_only_summary(facts)
    assert "--device cpu" in summary and "torch_eager" in summary and "`profile`" in summary


def test_driver_without_cuda_torch_fails():
    facts = Facts(torch_version="2.13.0+cpu", torch_cuda=None, driver_version="580.159")
    check = doctor.check_cuda(facts)
    assert check.status == FAIL and "CPU build" in check.detail


def test_nsys_that_cannot_import_reports_warns_with_the_libdw_fix():
    facts = _h100_facts(nsys_missing_libs=["libdw.so.1"], nsys_smoke_ran=True,
                        nsys_smoke="nsys left only a .qdstrm: its QdstrmImporter failed (Importer error status)")
    facts.tools["nsys"] = ToolInfo("nsys", "/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys",
                                   "2025.3.1.90", on_path=False)
    check = doctor.check_nsys(facts)
    assert check.status == WARN and "libdw.so.1" in check.detail and ".qdstrm" in check.detail
    assert "libdw1" in check.fix and "libelf1" in check.fix
    assert "export PATH=/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64:$PATH" in check.exports
    assert any(line.startswith("export LD_LIBRARY_PATH=") for line in check.exports)


def test_ncu_counters_restricted_warns():
    facts = _h100_facts(params_text="RmProfilingAdminOnly: 1\n", status_text="CapEff:\t0000000000000000\n")
    check = doctor.check_ncu(facts)
    assert check.status == WARN and "ERR_NVGPUCTRPERM" in check.detail and "NVreg_RestrictProfilingToAdminUsers=0" in check.fix


def test_ncu_deep_permission_error_warns():
    facts = _h100_facts(ncu_deep_ran=True, ncu_deep="==ERROR== ERR_NVGPUCTRPERM - The user does not have permission")
    assert doctor.check_ncu(facts).status == WARN


def test_extension_failing_on_a_gpu_machine_fails():
    facts = _h100_facts(extension_reason="extension failed to build: nvcc fatal: Unsupported gpu architecture")
    checks = doctor.diagnose(facts)
    assert _by_name(checks)["CUDA extension"].status == FAIL
    assert doctor.exit_code(checks) == 1


def test_unavailable_implementations_are_listed_with_reasons():
    facts = _h100_facts(impl_unavailable=[("verify", "ballot", "extension failed to build: ...")])
    check = doctor.check_implementations(facts)
    assert check.status == WARN and "verify/ballot: extension failed to build" in check.detail


# --- exit code and exports ---------------------------------------------------------------------
def test_exit_code_is_one_only_on_failure():
    assert doctor.exit_code([Check("a", PASS, ""), Check("b", WARN, "")]) == 0
    assert doctor.exit_code([Check("a", PASS, ""), Check("b", FAIL, "")]) == 1


def test_export_lines_deduplicated_and_only_for_findings():
    checks = [
        Check("a", WARN, "", exports=("export A=1", "export B=2")),
        Check("b", FAIL, "", exports=("export B=2",)),
        Check("c", PASS, "", exports=("export C=3",)),
    ]
    assert doctor.export_lines(checks) == ["export A=1", "export B=2"]


def test_json_round_trip():
    facts = _h100_facts(env={"PATH": "/usr/bin"})
    checks = doctor.diagnose(facts)
    data = json.loads(doctor.to_json(checks, facts))
    assert data["ok"] is True and data["cpu_only"] is False
    assert {c["name"] for c in data["checks"]} >= {"python", "torch", "nvcc", "JIT cache", "nsys", "ncu"}
    assert 'export TORCH_CUDA_ARCH_LIST="9.0"' in data["exports"]


@pytest.mark.parametrize("text, version", [
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159  Wed Jul 16 2025\nGCC version:  gcc 13\n", "580.159"),
    ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.03  Release Build\n", "580.159.03"),
    (None, None),
])
def test_driver_version_from_proc(text, version):
    assert doctor.driver_version(text) == version


# --- the command on this machine ---------------------------------------------------------------
def test_doctor_json_on_this_machine_parses_and_is_fast():
    started = time.perf_counter()
    result = runner.invoke(app, ["doctor", "--json"])
    elapsed = time.perf_counter() - started
    data = json.loads(result.stdout)
    assert result.exit_code == (0 if data["ok"] else 1)
    assert all(check["status"] in (PASS, WARN, FAIL) for check in data["checks"])
    if not torch.cuda.is_available():
        assert data["cpu_only"] is True and "--device cpu" in data["cpu_only_summary"]
        assert next(c for c in data["checks"] if c["name"] == "CUDA")["status"] == WARN
        assert elapsed < 20  # ~2 s here; generous for a loaded CI machine


def test_doctor_table_and_env_run():
    table = runner.invoke(app, ["doctor"])
    assert table.exit_code in (0, 1) and "sdbench doctor" in table.output and "Traceback" not in table.output
    env = runner.invoke(app, ["doctor", "--env"])
    lines = [line for line in env.stdout.splitlines() if line.strip()]
    assert lines and all(line.startswith(("#", "export ")) for line in lines)


def test_nsys_tiny_profile_success_outweighs_ldd():
    facts = _h100_facts(nsys_missing_libs=["libdw.so.1"], nsys_smoke_ran=True, nsys_smoke=None)
    check = doctor.check_nsys(facts)
    assert check.status == PASS and "a tiny profile wrote a report" in check.detail


# --- programmatic dependent launch (fused_logits' overlapping launches) ------------------------------
@pytest.mark.parametrize("facts_changes, status, says", [
    ({"triton_version": "3.6.0", "triton_launch_pdl": True}, PASS, "on:"),
    ({"triton_version": "3.2.0", "triton_launch_pdl": False}, WARN, "no launch_pdl"),  # before Triton 3.3
    ({"triton_version": "3.6.0", "triton_launch_pdl": True, "gpu": GpuInfo("NVIDIA L40S", "8.9", 142, 44.4)}, PASS,
     "sm_89"),
    ({"triton_version": "3.6.0", "triton_launch_pdl": True, "gpu": None}, PASS, "no GPU"),
    ({"triton_version": None}, PASS, "Triton does not import"),
])
def test_dependent_launch_says_whether_fused_logits_overlaps(facts_changes, status, says):
    check = doctor.check_pdl(_h100_facts(**facts_changes))
    assert check.status == status and says in check.detail
    assert bool(check.fix) == (status == WARN)


def test_doctor_reads_this_tritons_launcher():
    """On this machine: Triton's version and whether its launcher takes launch_pdl, as the kernels' own probe."""
    triton = pytest.importorskip("triton")
    from sdbench.ops.prob_verify_logits.triton_kernels import triton_launches_pdl

    facts = Facts()
    doctor._gather_triton(facts)
    assert facts.triton_version == triton.__version__ and facts.triton_launch_pdl == triton_launches_pdl()
    assert _by_name(doctor.diagnose(facts))["dependent launch"].status == PASS  # no GPU here, whatever Triton
