"""`sdbench doctor`: what this machine can and cannot do, each finding with its one-line fix.

Two layers, so every rule is testable on a CPU machine:
- `gather(deep)` reads the machine once into a `Facts` (imports, /proc files, `--version` probes
  with timeouts). It is the only function here that touches the system.
- `diagnose(facts)` turns Facts into `Check` rows (PASS / WARN / FAIL) with pure functions.

Cost: on a CPU machine doctor runs in about the time of `import torch` plus a few `--version`
probes (~2 s). The slow probes run only where they can tell something: the tiny `nsys profile`
(5-20 s) runs with `--deep`, or when nsys and a GPU are both present; the ncu counter test (a
profiled CUDA kernel, ~10 s) runs only with `--deep`. Without them, the nsys importer is checked
with `ldd` and ncu's counter permission with /proc/driver/nvidia/params and the process's
capabilities. On a GPU machine the CUDA extension status is its build: the first doctor there
builds it (about a minute cold, cached afterwards, as every CUDA command would).
"""

from __future__ import annotations

import importlib
import json
import os
import platform
import re
import shutil
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sdbench.measure import tools
from sdbench.measure.tools import ToolInfo

PASS, WARN, FAIL = "PASS", "WARN", "FAIL"
MIN_PYTHON = (3, 10)
FREE_DISK_WARN_BYTES = 2 * 2**30
FREE_DISK_FAIL_BYTES = 256 * 2**20

# Filesystem types that go over the network: the JIT writes many small files (multi-minute stalls).
NETWORK_FILESYSTEMS = frozenset({
    "nfs", "nfs3", "nfs4", "cifs", "smb", "smb2", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph",
    "cephfs", "glusterfs", "panfs", "afs", "openafs", "orangefs", "pvfs2", "wekafs", "9p", "sshfs",
    "davfs", "ncpfs", "quobyte", "vast", "gcsfuse", "s3fs", "rclone", "juicefs", "alluxio", "cvfs",
})

# Named archs torch accepts in TORCH_CUDA_ARCH_LIST (torch.utils.cpp_extension), expanded.
NAMED_ARCHS = {
    "Kepler+Tesla": "3.7", "Kepler": "3.5+PTX", "Maxwell+Tegra": "5.3", "Maxwell": "5.0;5.2+PTX",
    "Pascal": "6.0;6.1+PTX", "Volta+Tegra": "7.2", "Volta": "7.0+PTX", "Turing": "7.5+PTX",
    "Ampere+Tegra": "8.7", "Ampere": "8.0;8.6+PTX", "Ada": "8.9+PTX", "Hopper": "9.0+PTX",
    "Blackwell+Tegra": "11.0", "Blackwell": "10.0;10.3;12.0;12.1+PTX",
}


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # PASS | WARN | FAIL
    detail: str
    fix: str = ""
    exports: tuple[str, ...] = ()  # shell lines that fix it (`sdbench doctor --env`)


@dataclass(frozen=True)
class GpuInfo:
    name: str
    cc: str  # "9.0"
    sms: int
    memory_gib: float
    count: int = 1


@dataclass
class Facts:
    """Everything doctor reads from the machine. Tests build these by hand."""

    env: Mapping[str, str] = field(default_factory=dict)
    python_version: str = platform.python_version()
    torch_version: str | None = None
    torch_cuda: str | None = None  # torch.version.cuda; None for a CPU build
    torch_error: str | None = None
    gpu: GpuInfo | None = None
    driver_version: str | None = None  # the NVIDIA kernel driver, when one is loaded
    tools: dict[str, ToolInfo] = field(default_factory=dict)
    toolkits: list[tuple[str, str | None]] = field(default_factory=list)  # (CUDA toolkit root, version)
    ninja_version: str | None = None
    extensions_dir: str = ""
    extensions_dir_real: str = ""  # symlinks resolved: what /proc/mounts is matched against
    extensions_dir_from_env: bool = False
    mounts_text: str = ""
    free_bytes: int | None = None
    params_text: str | None = None  # /proc/driver/nvidia/params
    status_text: str | None = None  # /proc/self/status (capabilities)
    euid: int = 0
    nsys_importer: str | None = None
    nsys_missing_libs: list[str] = field(default_factory=list)
    nsys_smoke: str | None = None  # why the tiny profile wrote no report; None when it did
    nsys_smoke_ran: bool = False
    ncu_deep: str | None = None  # output excerpt of the deep ncu test when it failed
    ncu_deep_ran: bool = False
    extension_reason: str | None = None  # sdbench.ext.unavailable_reason()
    extension_known: bool = False  # sdbench.ext exists in this version
    impl_total: int = 0
    impl_unavailable: list[tuple[str, str, str]] = field(default_factory=list)  # (op, name, reason)
    impl_cpu: list[str] = field(default_factory=list)  # names that run on the CPU
    triton_version: str | None = None  # None: Triton does not import
    triton_launch_pdl: bool = False  # its CUDA launcher takes launch_pdl


# --- pure rules --------------------------------------------------------------------------------
def parse_mounts(mounts_text: str) -> list[tuple[str, str, str]]:
    """(device, mount point, fstype) per line of /proc/mounts; octal escapes (\\040) decoded."""
    mounts = []
    for line in mounts_text.splitlines():
        parts = line.split()
        if len(parts) >= 3:
            decode = lambda text: re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)  # noqa: E731
            mounts.append((decode(parts[0]), decode(parts[1]), parts[2]))
    return mounts


def filesystem_of(path: str, mounts_text: str) -> tuple[str, str, str] | None:
    """The mount holding path: the longest mount point that is a prefix of it (later mounts win ties)."""
    best = None
    for device, mount_point, fstype in parse_mounts(mounts_text):
        prefix = mount_point.rstrip("/") + "/"
        if path == mount_point or path.startswith(prefix) or mount_point == "/":
            if best is None or len(mount_point) >= len(best[1]):
                best = (device, mount_point, fstype)
    return best


def is_network_filesystem(fstype: str) -> bool:
    """nfs4, lustre, fuse.sshfs, fuse.beegfs... (a FUSE type counts by its sub-type)."""
    base = fstype.lower()
    return base in NETWORK_FILESYSTEMS or base.split(".", 1)[-1] in NETWORK_FILESYSTEMS


@dataclass(frozen=True)
class Arch:
    major: int
    minor: int
    suffix: str = ""  # "a" (arch-specific) or "f" (family) or ""
    ptx: bool = False

    @property
    def number(self) -> str:
        return f"{self.major}.{self.minor}{self.suffix}"

    def runs_on(self, major: int, minor: int) -> bool:
        """Whether code built for this entry loads on a device of compute capability major.minor."""
        if self.suffix == "a":
            return (self.major, self.minor) == (major, minor)
        if self.ptx:  # PTX JIT-compiles forward to any newer device
            return (self.major, self.minor) <= (major, minor)
        return self.major == major and self.minor <= minor  # SASS runs within its major version


def parse_arch_list(text: str) -> tuple[list[Arch], list[str]]:
    """TORCH_CUDA_ARCH_LIST -> (entries, unrecognised words), split the way torch splits it (; and space)."""
    for named, expansion in NAMED_ARCHS.items():
        text = text.replace(named, expansion)
    entries, bad = [], []
    for word in text.replace(" ", ";").split(";"):
        if not word:
            continue
        match = re.fullmatch(r"(\d+)\.(\d+)([af]?)(\+PTX)?", word)
        if match is None:
            bad.append(word)
            continue
        entries.append(Arch(int(match.group(1)), int(match.group(2)), match.group(3), bool(match.group(4))))
    return entries, bad


def check_arch_list(value: str | None, device_cc: str | None) -> Check:
    name = "TORCH_CUDA_ARCH_LIST"
    if device_cc is None:
        shown = value if value else "unset"
        return Check(name, PASS, f"{shown} (no GPU here: the device's arch is recommended on the GPU machine)")
    own = device_cc
    fix_line = f'export TORCH_CUDA_ARCH_LIST="{own}"'
    fix = f"build for this device only: {fix_line}"
    if not value:
        return Check(name, WARN, f"unset: sdbench's build picks this device's {own}, but other torch JIT builds "
                     "pick their own list; pin it", fix, (fix_line,))
    entries, bad = parse_arch_list(value)
    if bad:
        return Check(name, FAIL, f"{value!r}: torch rejects {', '.join(bad)} (entries like 9.0 or 9.0+PTX, "
                     "separated by ';' or spaces)", fix, (fix_line,))
    major, minor = (int(part) for part in own.split("."))
    if not any(entry.runs_on(major, minor) for entry in entries):
        return Check(name, FAIL, f"{value!r}: nothing built from it runs on this {own} device", fix, (fix_line,))
    extra = [entry.number for entry in entries if (entry.major, entry.minor) != (major, minor)]
    if extra:
        return Check(name, WARN, f"{value!r} also builds {', '.join(extra)}, which this {own} device does not "
                     "need (every extra arch adds build minutes)", fix, (fix_line,))
    return Check(name, PASS, f"{value} (this device is {own})")


def compare_nvcc_torch(nvcc_version: str | None, torch_cuda: str | None,
                       toolkits: list[tuple[str, str | None]] = ()) -> tuple[str, str, str, tuple[str, ...]]:
    """(status, detail, fix, exports) for nvcc's CUDA version against the one torch was built with."""
    if torch_cuda is None:
        return PASS, f"CUDA {nvcc_version} (torch is a CPU build: nvcc serves the compile check only)", "", ()
    ours, theirs = tools.major_minor(nvcc_version), tools.major_minor(torch_cuda)
    if ours is None or theirs is None or ours == theirs:
        return PASS, f"CUDA {nvcc_version}, torch built with CUDA {torch_cuda}", "", ()
    consequence = ("torch refuses to build extensions across CUDA major versions" if ours[0] != theirs[0]
                   else "torch warns; builds usually work, but the toolkit torch was built with is the safe one")
    detail = f"nvcc is CUDA {nvcc_version} but torch was built with CUDA {torch_cuda}: {consequence}"
    match = next((root for root, version in toolkits if tools.major_minor(version) == theirs), None)
    if match is not None:
        exports = (f"export CUDA_HOME={match}", f"export PATH={match}/bin:$PATH")
        return WARN, detail, f"put CUDA {torch_cuda} first: {'; '.join(exports)}", exports
    return WARN, detail, f"install the CUDA {torch_cuda} toolkit (or `module load cuda/{torch_cuda}`) and put its bin/ first on PATH", ()


def torch_cuda_home_guess(env: Mapping[str, str], nvcc_on_path: str | None) -> str | None:
    """Where torch.utils.cpp_extension will look for CUDA: CUDA_HOME, CUDA_PATH, dirname²(which nvcc),
    then /usr/local/cuda."""
    explicit = env.get("CUDA_HOME") or env.get("CUDA_PATH")
    if explicit:
        return explicit
    if nvcc_on_path:
        return os.path.dirname(os.path.dirname(nvcc_on_path))
    return "/usr/local/cuda" if os.path.exists("/usr/local/cuda") else None


def is_toolkit(path: str | None) -> bool:
    return bool(path) and (Path(path) / "bin" / "nvcc").exists() and (Path(path) / "include" / "cuda_runtime.h").exists()


# --- the checks --------------------------------------------------------------------------------
def check_python(version: str) -> Check:
    parts = tuple(int(part) for part in version.split(".")[:2])
    if parts < MIN_PYTHON:
        return Check("python", FAIL, f"{version}: sdbench needs Python >= 3.10", "use Python 3.10 or newer")
    return Check("python", PASS, version)


def check_torch(facts: Facts) -> Check:
    if facts.torch_version is None:
        return Check("torch", FAIL, f"torch does not import: {facts.torch_error}", "pip install torch (`make run` does it)")
    build = f"CUDA {facts.torch_cuda} build" if facts.torch_cuda else "CPU build"
    return Check("torch", PASS, f"{facts.torch_version} ({build})")


def cpu_only_summary(facts: Facts) -> str:
    """Plain words on what runs here without a GPU."""
    names = ", ".join(sorted(set(facts.impl_cpu))) or "the torch implementations"
    return (f"CPU-only here: `sweep` and `parity` run with --device cpu ({names}), `report` and `list` work; "
            "`profile`, the CUDA and Triton kernels and every GPU view (wall/graph/gpu) need a CUDA device")


def check_cuda(facts: Facts) -> Check:
    if facts.gpu is not None:
        return Check("CUDA", PASS, f"available: {facts.gpu.count} device(s)")
    if facts.torch_version is None:
        return Check("CUDA", FAIL, "unknown: torch does not import", "pip install torch")
    if facts.driver_version is not None:  # a driver, but torch cannot use it: the user wants a GPU
        if facts.torch_cuda is None:
            return Check("CUDA", FAIL, f"NVIDIA driver {facts.driver_version} is loaded but torch is a CPU build",
                         "install a CUDA build of torch (pip install torch from the CUDA index of your driver)")
        return Check("CUDA", FAIL, f"driver {facts.driver_version} is loaded but torch.cuda.is_available() is False",
                     "check CUDA_VISIBLE_DEVICES and `nvidia-smi`; the driver may be older than torch's CUDA "
                     f"{facts.torch_cuda} needs")
    return Check("CUDA", WARN, "no CUDA device: only the CPU paths run here (see the CPU-only line)",
                 "run on a GPU machine for the kernels and GPU timings")


def check_gpu(gpu: GpuInfo, driver: str | None) -> Check:
    more = f" (x{gpu.count})" if gpu.count > 1 else ""
    detail = (f"{gpu.name}{more}, compute capability {gpu.cc}, {gpu.sms} SMs, {gpu.memory_gib:.1f} GiB, "
              f"driver {driver or 'unknown'}")
    return Check("GPU", PASS, detail)


def check_nvcc(facts: Facts) -> Check:
    nvcc = facts.tools.get("nvcc") or ToolInfo("nvcc")
    if not nvcc.found:
        return Check("nvcc", WARN, "not found on PATH, CUDA_HOME or /usr/local/cuda*: the CUDA kernels cannot be "
                     "built (torch and Triton implementations still run)",
                     "install the CUDA toolkit, or `module load cuda` and check PATH")
    if nvcc.version is None:
        return Check("nvcc", WARN, f"{nvcc.path}: {nvcc.error}", "reinstall the CUDA toolkit")
    status, detail, fix, exports = compare_nvcc_torch(nvcc.version, facts.torch_cuda, facts.toolkits)
    if not nvcc.on_path:
        exports = exports or (f"export PATH={nvcc.directory}:$PATH",)
        return Check("nvcc", WARN, f"{nvcc.path} (CUDA {nvcc.version}) is not on PATH (lost after `module load`?)",
                     f"{exports[-1]}" + (f"; {fix}" if fix else ""), exports)
    return Check("nvcc", status, f"{nvcc.path}: {detail}", fix, exports)


def check_cuda_home(facts: Facts) -> Check:
    nvcc = facts.tools.get("nvcc") or ToolInfo("nvcc")
    guess = torch_cuda_home_guess(facts.env, nvcc.path if nvcc.on_path else None)
    real = tools.cuda_toolkit_root(nvcc.path)
    explicit = facts.env.get("CUDA_HOME") or facts.env.get("CUDA_PATH")
    target = str(real) if real else (facts.toolkits[0][0] if facts.toolkits else None)
    exports = (f"export CUDA_HOME={target}",) if target else ()
    fix = exports[0] if exports else "install the CUDA toolkit and export CUDA_HOME=<its folder>"
    if is_toolkit(guess):
        source = "CUDA_HOME" if explicit else "unset; torch derives it from nvcc on PATH"
        return Check("CUDA_HOME", PASS, f"{guess} ({source})")
    if facts.gpu is None and not explicit:  # nothing here builds CUDA kernels: not a problem to warn about
        return Check("CUDA_HOME", PASS, "unset; only needed to build the CUDA kernels on a GPU machine")
    if explicit:
        return Check("CUDA_HOME", WARN, f"{explicit} is not a CUDA toolkit (no bin/nvcc or include/cuda_runtime.h)",
                     fix, exports)
    if target is None:
        return Check("CUDA_HOME", WARN, "unset, and no CUDA toolkit was found", fix)
    if guess is None:
        return Check("CUDA_HOME", WARN, "unset, and torch finds no toolkit by itself (no nvcc on PATH)", fix, exports)
    return Check("CUDA_HOME", WARN, f"unset; torch would guess {guess}, which is not a CUDA toolkit "
                 "(nvcc on PATH is a wrapper or a symlink)", fix, exports)


def check_ninja(version: str | None) -> Check:
    if version is None:
        return Check("ninja", WARN, "not found: torch cannot JIT-build the CUDA extension", "pip install ninja")
    return Check("ninja", PASS, version)


def check_extensions_dir(path: str, from_env: bool, mounts_text: str, real_path: str | None = None) -> Check:
    name = "JIT cache"
    source = "TORCH_EXTENSIONS_DIR" if from_env else "sdbench default (TORCH_EXTENSIONS_DIR unset)"
    mount = filesystem_of(real_path or path, mounts_text)
    where = f" on {mount[2]} ({mount[1]})" if mount else ""
    if mount and is_network_filesystem(mount[2]):
        local = f"/tmp/sdbench-extensions-{_user()}"  # sdbench's own default, on a local disk
        line = f"export TORCH_EXTENSIONS_DIR={local}"
        return Check(name, WARN, f"{path}{where}, a network filesystem: the JIT writes many small files "
                     "(multi-minute stalls)", line, (line,))
    return Check(name, PASS, f"{path}{where}; {source}")


def check_free_disk(path: str, free_bytes: int | None) -> Check:
    if free_bytes is None:
        return Check("free disk", WARN, f"could not read free space for {path}")
    shown = f"{free_bytes / 2**30:.1f} GiB free for {path}"
    if free_bytes < FREE_DISK_FAIL_BYTES:
        return Check("free disk", FAIL, shown + ": too little for the JIT build", "free space or move TORCH_EXTENSIONS_DIR")
    if free_bytes < FREE_DISK_WARN_BYTES:
        return Check("free disk", WARN, shown, "free space or move TORCH_EXTENSIONS_DIR")
    return Check("free disk", PASS, shown)


def _not_found(info: ToolInfo, what: str, has_gpu: bool, fix: str) -> Check:
    if has_gpu:
        return Check(info.name, WARN, f"not found (looked on PATH, CUDA_HOME, /usr/local/cuda*, /opt/nvidia): {what}", fix)
    return Check(info.name, PASS, f"not found; {what} (only matters on a GPU machine)")


def _where(info: ToolInfo) -> str:
    return f"{info.path} ({info.version or 'version unknown'})" + ("" if info.on_path else ", not on PATH")


def _path_exports(info: ToolInfo) -> tuple[str, ...]:
    return () if info.on_path or not info.found else (f"export PATH={info.directory}:$PATH",)


def check_nsys(facts: Facts) -> Check:
    info = facts.tools.get("nsys") or ToolInfo("nsys")
    has_gpu = facts.gpu is not None
    if not info.found:
        return _not_found(info, "`sdbench profile --tool nsys` is unavailable", has_gpu,
                          "install Nsight Systems (or use --tool torch)")
    where = _where(info)
    exports = _path_exports(info)
    # A tiny profile that ran is the evidence; without one, ldd's view of the importer is.
    broken = facts.nsys_smoke is not None if facts.nsys_smoke_ran else bool(facts.nsys_missing_libs)
    if broken:
        why = []
        if facts.nsys_missing_libs:
            why.append(f"its QdstrmImporter cannot load {', '.join(facts.nsys_missing_libs)} (ldd)")
        if facts.nsys_smoke_ran and facts.nsys_smoke:
            why.append(f"a tiny profile failed: {facts.nsys_smoke}")
        fix = tools.importer_fix(facts.nsys_missing_libs or ["libdw.so.1"])
        lib_export = f"export LD_LIBRARY_PATH={tools.nsys_libs_dir()}:$LD_LIBRARY_PATH"
        return Check("nsys", WARN if has_gpu else PASS,
                     f"{where}: cannot write reports, {'; '.join(why)}", fix, exports + (lib_export,))
    tested = ", a tiny profile wrote a report" if facts.nsys_smoke_ran else ""
    if not info.on_path:
        return Check("nsys", WARN, f"{where}{tested}", exports[0], exports)
    return Check("nsys", PASS, f"{where}{tested}")


def check_ncu(facts: Facts) -> Check:
    info = facts.tools.get("ncu") or ToolInfo("ncu")
    has_gpu = facts.gpu is not None
    if not info.found:
        return _not_found(info, "no hardware counters (warp efficiency, occupancy)", has_gpu,
                          "install Nsight Compute (or use --tool torch / nsys)")
    where = _where(info)
    exports = _path_exports(info)
    if facts.ncu_deep_ran and facts.ncu_deep:
        if tools.is_ncu_permission_error(facts.ncu_deep):
            return Check("ncu", WARN, f"{where}: ERR_NVGPUCTRPERM, hardware counters are not readable",
                         tools.NCU_PERMISSION_FIX, exports)
        return Check("ncu", WARN, f"{where}: a tiny profile failed: {facts.ncu_deep}", "run the ncu command by hand", exports)
    readable = tools.counters_readable(facts.params_text, facts.status_text, facts.euid)
    if readable is False:
        return Check("ncu", WARN if has_gpu else PASS, f"{where}: the driver restricts GPU counters to admins "
                     "(RmProfilingAdminOnly: 1) and this process lacks CAP_SYS_ADMIN/CAP_PERFMON: ncu will likely "
                     "fail with ERR_NVGPUCTRPERM (`sdbench doctor --deep` tries it)", tools.NCU_PERMISSION_FIX, exports)
    counters = {True: "counters readable", None: "counter permission unknown (no driver setting)", False: ""}[readable]
    if facts.ncu_deep_ran:
        counters = "a tiny profile read the counters"
    status = WARN if exports else PASS
    return Check("ncu", status, f"{where}, {counters}", exports[0] if exports else "", exports)


def check_sanitizer(facts: Facts) -> Check:
    info = facts.tools.get("compute-sanitizer") or ToolInfo("compute-sanitizer")
    if not info.found:
        return _not_found(info, "no memcheck/racecheck runs", facts.gpu is not None, "install the CUDA toolkit")
    exports = _path_exports(info)
    where = _where(info)
    return Check("compute-sanitizer", WARN if exports else PASS, where, exports[0] if exports else "", exports)


def check_extension(facts: Facts) -> Check:
    if not facts.extension_known:
        return Check("CUDA extension", WARN, "sdbench.ext is not part of this version", "")
    if facts.extension_reason is None:
        return Check("CUDA extension", PASS, "builds and loads")
    if facts.gpu is None:
        return Check("CUDA extension", PASS, f"not built here: {facts.extension_reason}")
    return Check("CUDA extension", FAIL, facts.extension_reason,
                 "fix the checks above (nvcc, CUDA_HOME, ninja, TORCH_CUDA_ARCH_LIST), then rerun doctor")


def check_pdl(facts: Facts) -> Check:
    """Whether fused_logits overlaps its launches here (programmatic dependent launch: sm_90+ and a Triton whose
    launcher takes launch_pdl); in a CUDA graph that is ~1 µs a step (docs/perf-notes.md, "Session 23")."""
    name = "dependent launch"
    if facts.triton_version is None:
        return Check(name, PASS, "Triton does not import: no Triton kernel runs here (see implementations)")
    if facts.gpu is None:
        return Check(name, PASS, "no GPU here: fused_logits overlaps its kernels on sm_90+ GPUs")
    major = int(facts.gpu.cc.split(".")[0])
    if major < 9:
        return Check(name, PASS, f"off: this sm_{facts.gpu.cc.replace('.', '')} GPU has none (sm_90+), so "
                     "fused_logits' kernels run one after another")
    if not facts.triton_launch_pdl:
        return Check(name, WARN, f"off: Triton {facts.triton_version}'s launcher has no launch_pdl, so fused_logits' "
                     "kernels cannot overlap (about 1 µs a step in a CUDA graph)", "pip install 'triton>=3.3'")
    return Check(name, PASS, f"on: fused_logits' scan kernel and race start during the kernel ahead (Triton "
                 f"{facts.triton_version})")


def check_implementations(facts: Facts) -> Check:
    unavailable = facts.impl_unavailable
    if not unavailable:
        return Check("implementations", PASS, f"all {facts.impl_total} run here")
    by_reason: dict[str, list[str]] = {}  # one build failure makes every CUDA kernel unavailable: say it once
    for op, name, reason in unavailable:
        first_line = reason.strip().splitlines()[0] if reason.strip() else "no reason given"
        by_reason.setdefault(first_line[:200], []).append(f"{op}/{name}")
    listed = "; ".join(f"{', '.join(names)}: {reason}" for reason, names in by_reason.items())
    runnable = facts.impl_total - len(unavailable)
    detail = f"{runnable} of {facts.impl_total} run here; unavailable: {listed}"
    if facts.gpu is None:
        return Check("implementations", PASS, detail)
    return Check("implementations", WARN, detail, "see the reasons; `sdbench list` shows them all")


def diagnose(facts: Facts) -> list[Check]:
    """Every check, in the order a user fixes them."""
    checks = [check_python(facts.python_version), check_torch(facts), check_cuda(facts)]
    if facts.gpu is not None:
        checks.append(check_gpu(facts.gpu, facts.driver_version))
    checks += [
        check_nvcc(facts),
        check_cuda_home(facts),
        check_ninja(facts.ninja_version),
        check_extensions_dir(facts.extensions_dir, facts.extensions_dir_from_env, facts.mounts_text,
                             facts.extensions_dir_real),
        check_free_disk(facts.extensions_dir, facts.free_bytes),
        check_arch_list(facts.env.get("TORCH_CUDA_ARCH_LIST"), facts.gpu.cc if facts.gpu else None),
        check_nsys(facts),
        check_ncu(facts),
        check_sanitizer(facts),
        check_extension(facts),
        check_implementations(facts),
        check_pdl(facts),
    ]
    return checks


def exit_code(checks: list[Check]) -> int:
    """1 when any check FAILs, else 0 (WARNs do not fail)."""
    return 1 if any(check.status == FAIL for check in checks) else 0


def export_lines(checks: list[Check]) -> list[str]:
    """The shell lines that fix what doctor found, deduplicated, in check order."""
    lines: list[str] = []
    for check in checks:
        for line in check.exports:
            if check.status != PASS and line not in lines:
                lines.append(line)
    return lines


def to_json(checks: list[Check], facts: Facts) -> str:
    return json.dumps({
        "ok": exit_code(checks) == 0,
        "cpu_only": facts.gpu is None,
        "cpu_only_summary": cpu_only_summary(facts) if facts.gpu is None else None,
        "checks": [{key: value for key, value in asdict(check).items() if key != "exports"} | {"exports": list(check.exports)}
                   for check in checks],
        "exports": export_lines(checks),
    }, indent=2)


# --- reading the machine -----------------------------------------------------------------------
def _user() -> str:
    try:
        import getpass

        return getpass.getuser()
    except Exception:
        return str(os.getuid())


def default_extensions_dir(env: Mapping[str, str]) -> tuple[str, bool]:
    """(where the JIT cache will live, whether TORCH_EXTENSIONS_DIR chose it)."""
    if env.get("TORCH_EXTENSIONS_DIR"):
        return env["TORCH_EXTENSIONS_DIR"], True
    try:
        ext = importlib.import_module("sdbench.ext")
        return str(ext.cache_root()), False
    except Exception:  # sdbench.ext absent or broken: its documented default
        return f"/tmp/sdbench-extensions-{_user()}", False


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return None


def driver_version(proc_version_text: str | None) -> str | None:
    """'NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159  ...' -> '580.159'."""
    if not proc_version_text:
        return None
    match = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", proc_version_text)
    return match.group(1) if match else None


def _free_bytes(path: str) -> int | None:
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return shutil.disk_usage(probe).free
    except OSError:
        return None


def _toolkits(env: Mapping[str, str]) -> list[tuple[str, str | None]]:
    found = []
    for directory in tools.search_dirs("nvcc", env):
        root = directory.parent
        if not is_toolkit(str(root)):
            continue
        version = None
        info = _read(str(root / "version.json"))
        if info:
            try:
                version = json.loads(info).get("cuda", {}).get("version")
            except ValueError:
                version = None
        if version is None:
            match = re.search(r"cuda-(\d+\.\d+)", str(os.path.realpath(root)))
            version = match.group(1) if match else None
        if all(os.path.realpath(root) != os.path.realpath(seen) for seen, _ in found):
            found.append((str(root), version))
    return found


def _gather_torch(facts: Facts) -> None:
    try:
        import torch
    except Exception as err:  # a broken install is a finding, not a crash
        facts.torch_error = f"{type(err).__name__}: {err}"
        return
    facts.torch_version = torch.__version__
    facts.torch_cuda = torch.version.cuda
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        facts.gpu = GpuInfo(props.name, f"{props.major}.{props.minor}", props.multi_processor_count,
                            props.total_memory / 2**30, torch.cuda.device_count())


def _gather_triton(facts: Facts) -> None:
    try:
        import triton

        from sdbench.ops.prob_verify_logits.triton_kernels import triton_launches_pdl
    except Exception:  # no Triton (or it does not import): the implementations check says which kernels that costs
        return
    facts.triton_version = triton.__version__
    facts.triton_launch_pdl = triton_launches_pdl()


def _gather_registry(facts: Facts) -> None:
    try:
        from sdbench import registry

        device = "cuda" if facts.gpu is not None else "cpu"
        impls = registry.implementations()
    except Exception as err:
        facts.impl_unavailable = [("*", "*", f"the registry failed to load: {type(err).__name__}: {err}")]
        return
    facts.impl_total = len(impls)
    for impl in impls:
        try:
            reason = impl.unavailable_reason(device)
        except Exception as err:
            reason = f"probe raised {type(err).__name__}: {err}"
        if reason is not None:
            facts.impl_unavailable.append((impl.op, impl.name, reason))
        if facts.gpu is None and reason is None:
            facts.impl_cpu.append(impl.name)


def extension_cached() -> bool:
    """Whether sdbench.ext's build for this torch / CUDA / arch is already in the cache (no build needed)."""
    try:
        ext = importlib.import_module("sdbench.ext")
        return any(ext.build_directory(ext.arch_list() or "default").glob("*.so"))
    except Exception:
        return False


def _gather_extension(facts: Facts) -> None:
    try:
        ext = importlib.import_module("sdbench.ext")
    except ModuleNotFoundError as err:
        if err.name != "sdbench.ext":
            facts.extension_known, facts.extension_reason = True, f"sdbench.ext failed to import: {err}"
        return
    except Exception as err:
        facts.extension_known, facts.extension_reason = True, f"sdbench.ext failed to import: {err}"
        return
    facts.extension_known = True
    try:
        facts.extension_reason = ext.unavailable_reason()
    except Exception as err:
        facts.extension_reason = f"unavailable_reason() raised {type(err).__name__}: {err}"


def _deep_ncu(ncu_path: str, env: Mapping[str, str]) -> str | None:
    """Profile one small torch kernel with one counter; None when the counters were read."""
    program = "import torch; x = torch.ones(1024, device='cuda'); (x + 1).sum().item()"
    code, text = tools.run_quietly(
        [ncu_path, "--metrics", "sm__cycles_elapsed.avg", "--launch-count", "1", sys.executable, "-c", program],
        env=env, timeout=120,
    )
    if code == 0 and "sm__cycles_elapsed.avg" in text and not tools.is_ncu_permission_error(text):
        return None
    lines = [line for line in text.splitlines() if "ERR_NVGPUCTRPERM" in line or "==ERROR==" in line]
    return (lines[0] if lines else (text.strip().splitlines() or ["no output"])[-1]).strip()


def gather(deep: bool = False, env: Mapping[str, str] | None = None, progress=None) -> Facts:
    """Read this machine once. deep: also run the tiny nsys and ncu profiles (slow).

    On a GPU machine this builds sdbench's CUDA extension when it is not cached yet (about a minute
    cold; what every CUDA command would do first anyway). progress(text) hears about slow steps.
    """
    say = progress or (lambda text: None)
    env = dict(os.environ if env is None else env)
    facts = Facts(env=env, euid=os.geteuid() if hasattr(os, "geteuid") else 0)
    _gather_torch(facts)
    proc_version = _read("/proc/driver/nvidia/version")
    facts.driver_version = driver_version(proc_version)
    if facts.driver_version is None and facts.gpu is not None:  # no /proc entry (some containers): NVML / nvidia-smi
        try:
            from sdbench.measure import environment as envinfo

            facts.driver_version = envinfo.clocks_and_driver("cuda").get("driver")
        except Exception:
            pass
    facts.params_text = _read("/proc/driver/nvidia/params")
    facts.status_text = _read("/proc/self/status")
    facts.tools = {name: tools.probe_tool(name, env) for name in tools.TOOLS}
    facts.toolkits = _toolkits(env)
    ninja = shutil.which("ninja", path=env.get("PATH", ""))
    if ninja:
        code, text = tools.run_quietly([ninja, "--version"], env=env, timeout=5)
        facts.ninja_version = text.strip() if code == 0 else None
    facts.extensions_dir, facts.extensions_dir_from_env = default_extensions_dir(env)
    facts.mounts_text = _read("/proc/mounts") or ""
    facts.extensions_dir_real = os.path.realpath(facts.extensions_dir)
    facts.free_bytes = _free_bytes(facts.extensions_dir_real)
    nsys = facts.tools["nsys"]
    if nsys.found:
        importer, facts.nsys_missing_libs = tools.importer_missing_libraries(nsys.path, env)
        facts.nsys_importer = str(importer) if importer else None
        if deep or facts.gpu is not None:
            say("trying a tiny `nsys profile`")
            facts.nsys_smoke_ran = True
            facts.nsys_smoke = tools.nsys_smoke_test(nsys.path, env)
    if deep and facts.gpu is not None and facts.tools["ncu"].found:
        say("reading one hardware counter with ncu")
        facts.ncu_deep_ran = True
        facts.ncu_deep = _deep_ncu(facts.tools["ncu"].path, env)
    if facts.gpu is not None and not extension_cached():
        say("building sdbench's CUDA extension (cold: about a minute; cached afterwards)")
    _gather_extension(facts)
    _gather_registry(facts)
    _gather_triton(facts)
    return facts
