"""Finding and checking the NVIDIA command-line tools: nvcc, nsys, ncu, compute-sanitizer.

Everything here is a plain function over explicit inputs (an environment mapping, a filesystem root,
a captured text) so `sdbench doctor` and `sdbench profile` can be tested on a CPU machine with fake
directory trees and captured tool output.

Why look beyond PATH: after `module load cuda` or on a fresh image the tools are often installed but
not on PATH. On the H100 host nsys lives only at
/opt/nvidia/nsight-compute/<version>/host/target-linux-x64/nsys, and its report importer
(QdstrmImporter) cannot load libdw.so.1, so `nsys profile` leaves only a .qdstrm behind.
"""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

TOOLS = ("nvcc", "nsys", "ncu", "compute-sanitizer")

# Where each tool hides, in search order after PATH. "{cuda}" expands to $CUDA_HOME and $CUDA_PATH;
# other patterns are globbed under the filesystem root, newest version first.
SEARCH_PATTERNS: dict[str, tuple[str, ...]] = {
    "nvcc": ("{cuda}/bin", "usr/local/cuda/bin", "usr/local/cuda-*/bin", "opt/cuda/bin"),
    "nsys": (
        "{cuda}/bin",
        "{cuda}/nsight-systems-*/bin",
        "opt/nvidia/nsight-systems/*/bin",
        "opt/nvidia/nsight-systems*/bin",
        "opt/nvidia/nsight-systems/*/target-linux-x64",
        "usr/local/cuda/bin",
        "usr/local/cuda-*/bin",
        "usr/local/cuda*/nsight-systems-*/bin",
        "opt/nvidia/nsight-compute/*/host/target-linux-x64",  # the H100 host's only nsys
    ),
    "ncu": (
        "{cuda}/bin",
        "{cuda}/nsight-compute-*",
        "opt/nvidia/nsight-compute/*",
        "usr/local/cuda/bin",
        "usr/local/cuda-*/bin",
        "usr/local/cuda*/nsight-compute-*",
    ),
    "compute-sanitizer": (
        "{cuda}/bin",
        "{cuda}/compute-sanitizer",
        "usr/local/cuda/bin",
        "usr/local/cuda-*/bin",
        "usr/local/cuda*/compute-sanitizer",
    ),
}

VERSION_PATTERNS = {
    "nvcc": r"release (\d+\.\d+)",  # "Cuda compilation tools, release 13.0, V13.0.88"
    "nsys": r"version (\d+\.\d+\.\d+(?:\.\d+)?)",  # "NVIDIA Nsight Systems version 2025.3.1.90-..."
    "ncu": r"Version (\d+\.\d+\.\d+(?:\.\d+)?)",  # "Version 2025.3.1.0 (build 36398880)"
    "compute-sanitizer": r"Version (\d+\.\d+\.\d+(?:\.\d+)?)",
}

PROBE_TIMEOUT_S = 15.0

# Where `sdbench doctor` tells users to unpack libdw1 + libelf1; sdbench adds it to nsys's
# LD_LIBRARY_PATH by itself when it exists.
NSYS_LIBS_DIR = Path.home() / ".local" / "nsys-libs"
NSYS_LIBS_SUBDIR = "usr/lib/x86_64-linux-gnu"
# Debian packages that provide the libraries QdstrmImporter is known to miss.
LIBRARY_PACKAGES = {"libdw.so.1": "libdw1", "libelf.so.1": "libelf1"}

NCU_PERMISSION_ERROR = "ERR_NVGPUCTRPERM"
NCU_PERMISSION_FIX = (
    "run as root, or add `options nvidia NVreg_RestrictProfilingToAdminUsers=0` to a file in "
    "/etc/modprobe.d/ and reload the driver (a container also needs --cap-add SYS_ADMIN); "
    "see https://developer.nvidia.com/ERR_NVGPUCTRPERM"
)


# --- discovery ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class ToolInfo:
    """One tool as found here: path is None when it was found nowhere."""

    name: str
    path: str | None = None
    version: str | None = None
    on_path: bool = False
    searched: tuple[str, ...] = ()  # the directories looked in, for "not found" messages
    error: str | None = None  # it exists but `--version` failed

    @property
    def found(self) -> bool:
        return self.path is not None

    @property
    def directory(self) -> str | None:
        return str(Path(self.path).parent) if self.path else None


def _version_key(path: Path) -> list:
    """Sort key that orders cuda-12.4 < cuda-12.10 < cuda-13.0 (numbers compared as numbers)."""
    return [(1, int(part), "") if part.isdigit() else (0, 0, part) for part in re.split(r"(\d+)", str(path))]


def _cuda_homes(env: Mapping[str, str]) -> list[str]:
    homes = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        value = env.get(var)
        if value and value not in homes:
            homes.append(value)
    return homes


def search_dirs(name: str, env: Mapping[str, str], root: Path = Path("/")) -> list[Path]:
    """Directories (existing, deduplicated, in search order) where name may live, beyond PATH."""
    dirs: list[Path] = []
    for pattern in SEARCH_PATTERNS[name]:
        if pattern.startswith("{cuda}"):
            for home in _cuda_homes(env):
                rest = pattern[len("{cuda}"):].lstrip("/")
                base = Path(home)
                dirs.extend(sorted(base.glob(rest), key=_version_key, reverse=True) if "*" in rest else [base / rest])
        else:
            dirs.extend(sorted(root.glob(pattern), key=_version_key, reverse=True))
    unique: list[Path] = []
    for directory in dirs:
        if directory.is_dir() and directory not in unique:
            unique.append(directory)
    return unique


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def find_tool(name: str, env: Mapping[str, str] | None = None, root: Path = Path("/")) -> ToolInfo:
    """Find name on PATH, then in SEARCH_PATTERNS; the version is not probed (see probe_tool)."""
    env = os.environ if env is None else env
    on_path = shutil.which(name, path=env.get("PATH", ""))
    dirs = search_dirs(name, env, root)
    searched = ("PATH", *(str(d) for d in dirs))
    if on_path:
        return ToolInfo(name, path=on_path, on_path=True, searched=searched)
    for directory in dirs:
        if _is_executable(directory / name):
            return ToolInfo(name, path=str(directory / name), on_path=False, searched=searched)
    return ToolInfo(name, searched=searched)


def run_quietly(argv: list[str], env: Mapping[str, str] | None = None, timeout: float = PROBE_TIMEOUT_S,
                cwd: str | None = None) -> tuple[int | None, str]:
    """(exit code, stdout+stderr); exit code None when it could not start or timed out."""
    try:
        done = subprocess.run(
            argv, env=dict(env) if env is not None else None, cwd=cwd, capture_output=True, text=True,
            timeout=timeout, errors="replace",
        )
    except subprocess.TimeoutExpired:
        return None, f"{Path(argv[0]).name} did not answer within {timeout:.0f} s"
    except OSError as err:
        return None, f"{Path(argv[0]).name} could not start: {err}"
    return done.returncode, (done.stdout or "") + (done.stderr or "")


def parse_version(name: str, text: str) -> str | None:
    """The version in `<tool> --version` output, or None."""
    match = re.search(VERSION_PATTERNS[name], text)
    return match.group(1) if match else None


def probe_tool(name: str, env: Mapping[str, str] | None = None, root: Path = Path("/")) -> ToolInfo:
    """find_tool plus `--version` (with a timeout)."""
    info = find_tool(name, env, root)
    if not info.found:
        return info
    code, text = run_quietly([info.path, "--version"], env=env)
    version = parse_version(name, text)
    if version is None:
        first_line = next((line for line in text.splitlines() if line.strip()), "no output")
        error = f"`{info.path} --version` failed: {first_line.strip()}" if code != 0 else "unrecognised --version output"
        return ToolInfo(name, info.path, None, info.on_path, info.searched, error)
    return ToolInfo(name, info.path, version, info.on_path, info.searched)


def cuda_toolkit_root(nvcc_path: str | None) -> Path | None:
    """The toolkit directory (holding bin/nvcc and include/cuda_runtime.h) behind an nvcc.

    Follows symlinks, and small wrapper scripts that `exec /path/to/cuda/bin/nvcc` (as on the CPU
    machines, where /usr/local/bin/nvcc is such a script).
    """
    if nvcc_path is None:
        return None
    candidates = [Path(os.path.realpath(nvcc_path)).parent.parent]
    try:
        if Path(nvcc_path).stat().st_size < 4096:
            text = Path(nvcc_path).read_text(errors="replace")
            candidates += [Path(match) for match in re.findall(r"(/[^\s\"']+)/bin/nvcc\b", text)]
    except OSError:
        pass
    for candidate in candidates:
        if (candidate / "bin" / "nvcc").exists() and (candidate / "include" / "cuda_runtime.h").exists():
            return candidate
    return None


def major_minor(version: str | None) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


# --- nsys: the importer trap -------------------------------------------------------------------
def find_qdstrm_importer(nsys_path: str | Path) -> Path | None:
    """The QdstrmImporter that turns nsys's raw .qdstrm into a .nsys-rep, near the nsys binary."""
    start = Path(os.path.realpath(nsys_path)).parent
    for ancestor in (start, start.parent, start.parent.parent):
        for pattern in ("QdstrmImporter", "*/QdstrmImporter", "*/*/QdstrmImporter"):
            for found in sorted(ancestor.glob(pattern)):
                if found.is_file():
                    return found
    return None


def missing_libraries(ldd_text: str) -> list[str]:
    """Libraries `ldd` reports as 'not found'."""
    return re.findall(r"^\s*(\S+)\s+=>\s+not found", ldd_text, flags=re.MULTILINE)


def nsys_libs_dir(home_libs: Path = NSYS_LIBS_DIR) -> Path:
    return home_libs / NSYS_LIBS_SUBDIR


def nsys_env(env: Mapping[str, str] | None = None, home_libs: Path = NSYS_LIBS_DIR) -> dict[str, str]:
    """env with the unpacked libdw/libelf folder prepended to LD_LIBRARY_PATH when it exists."""
    env = dict(os.environ if env is None else env)
    libs = nsys_libs_dir(home_libs)
    current = env.get("LD_LIBRARY_PATH", "")
    if libs.is_dir() and str(libs) not in current.split(":"):
        env["LD_LIBRARY_PATH"] = f"{libs}:{current}" if current else str(libs)
    return env


def importer_missing_libraries(nsys_path: str, env: Mapping[str, str] | None = None) -> tuple[Path | None, list[str]]:
    """(importer path, libraries it cannot load) — fast: one `ldd`, no profiling."""
    importer = find_qdstrm_importer(nsys_path)
    if importer is None or shutil.which("ldd") is None:
        return importer, []
    code, text = run_quietly(["ldd", str(importer)], env=nsys_env(env), timeout=10)
    if code is None:
        return importer, []
    # nsys puts its own folders on the importer's library path at run time: a library shipped
    # there is not missing, whatever ldd says from outside.
    shipped = lambda lib: any(importer.parent.glob(lib)) or any(importer.parent.parent.glob(f"*/{lib}"))  # noqa: E731
    return importer, [lib for lib in missing_libraries(text) if not shipped(lib)]


def importer_fix(missing: list[str], libs_dir: Path = NSYS_LIBS_DIR) -> str:
    """The one-line recipe that gives QdstrmImporter its missing libraries."""
    packages = sorted({LIBRARY_PACKAGES.get(lib, lib) for lib in missing} | {"libdw1", "libelf1"})
    return (
        f"apt-get download {' '.join(packages)} (on any Debian/Ubuntu machine with network), then "
        f"for deb in *.deb; do dpkg -x $deb {libs_dir}; done and "
        f"export LD_LIBRARY_PATH={libs_dir / NSYS_LIBS_SUBDIR}:$LD_LIBRARY_PATH"
    )


# A program that initialises the CUDA driver without importing torch (fast), and succeeds without one.
_TINY_CUDA_PROGRAM = (
    "import ctypes\n"
    "try:\n    ctypes.CDLL('libcuda.so.1').cuInit(0)\n"
    "except OSError:\n    pass\n"
)


def nsys_smoke_test(nsys_path: str, env: Mapping[str, str] | None = None, timeout: float = 90.0) -> str | None:
    """Run a tiny `nsys profile`; None when it wrote a .nsys-rep, else why not (one line)."""
    with tempfile.TemporaryDirectory(prefix="sdbench-nsys-") as workdir:
        report = Path(workdir) / "rep"
        argv = [
            nsys_path, "profile", "--trace=cuda", "--sample=none", "--cpuctxsw=none",
            "-o", str(report), "-f", "true", sys.executable, "-c", _TINY_CUDA_PROGRAM,
        ]
        code, text = run_quietly(argv, env=nsys_env(env), timeout=timeout, cwd=workdir)
        return nsys_report_problem(text, report, code)


def nsys_report_problem(output: str, report_base: Path, code: int | None) -> str | None:
    """Why `nsys profile -o report_base` left no report_base.nsys-rep (None when it did)."""
    if report_base.with_name(report_base.name + ".nsys-rep").exists():
        return None
    if code is None:
        return output.strip().splitlines()[-1] if output.strip() else "nsys did not finish"
    if report_base.with_name(report_base.name + ".qdstrm").exists() or "Importer error" in output:
        return "nsys left only a .qdstrm: its QdstrmImporter failed (Importer error status)"
    last = next((line for line in reversed(output.splitlines()) if line.strip()), "no output")
    return f"nsys profile wrote no report (exit {code}): {last.strip()}"


# --- ncu: hardware counter permission ----------------------------------------------------------
def profiling_admin_only(params_text: str | None) -> bool | None:
    """Whether the driver restricts GPU performance counters to admin users, from
    /proc/driver/nvidia/params (RmProfilingAdminOnly, set by NVreg_RestrictProfilingToAdminUsers);
    None when the file says nothing about it."""
    if not params_text:
        return None
    match = re.search(r"^\s*(?:RmProfilingAdminOnly|RestrictProfilingToAdminUsers)\s*:\s*(\d+)", params_text,
                      flags=re.MULTILINE)
    return None if match is None else match.group(1) != "0"


CAP_SYS_ADMIN, CAP_PERFMON = 21, 38


def has_profiling_capability(status_text: str | None, euid: int) -> bool:
    """Whether this process may read admin-only counters: CAP_SYS_ADMIN or CAP_PERFMON in CapEff
    (/proc/self/status). Root in a container usually lacks both; without the file, root counts."""
    match = re.search(r"^CapEff:\s*([0-9a-fA-F]+)", status_text or "", flags=re.MULTILINE)
    if match is None:
        return euid == 0
    caps = int(match.group(1), 16)
    return bool(caps >> CAP_SYS_ADMIN & 1 or caps >> CAP_PERFMON & 1)


def counters_readable(params_text: str | None, status_text: str | None, euid: int) -> bool | None:
    """True/False when the driver setting decides it, None when unknown (no driver, no setting).
    A static guess: only profiling a kernel proves it (ncu then fails with ERR_NVGPUCTRPERM)."""
    admin_only = profiling_admin_only(params_text)
    if admin_only is None:
        return None
    return not admin_only or has_profiling_capability(status_text, euid)


def is_ncu_permission_error(text: str) -> bool:
    return NCU_PERMISSION_ERROR in text


# --- parsing profiler output -------------------------------------------------------------------
@dataclass(frozen=True)
class NsysKernel:
    """One row of `nsys stats --report cuda_gpu_kern_sum` (times in ns, over the whole capture)."""

    name: str
    total_ns: float
    instances: int
    avg_ns: float
    med_ns: float
    min_ns: float
    max_ns: float


def _number(text: str) -> float | None:
    """'1,234.5' -> 1234.5 (ncu and nsys print thousands separators); None for n/a and blanks."""
    cleaned = text.strip().replace(",", "")
    try:
        return float(cleaned)
    except ValueError:
        return None


def _csv_from(text: str, header_starts: tuple[str, ...]) -> list[list[str]]:
    """CSV rows from the first line starting with one of header_starts (tools print banners first)."""
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if line.lstrip().startswith(header_starts):
            body = []
            for row_line in lines[index:]:
                if not row_line.strip() or row_line.startswith("=="):
                    if body:
                        break
                    continue
                body.append(row_line)
            return list(csv.reader(io.StringIO("\n".join(body))))
    return []


def parse_nsys_kern_sum(text: str) -> list[NsysKernel]:
    """Kernels from `nsys stats --report cuda_gpu_kern_sum --format csv` (empty when none ran)."""
    rows = _csv_from(text, ("Time (%)", '"Time (%)"', "Time(%)", '"Time(%)"'))
    if not rows:
        return []
    header = [column.strip() for column in rows[0]]

    def column(*names: str) -> int:
        for name in names:
            if name in header:
                return header.index(name)
        raise ValueError(f"nsys stats CSV has no {names[0]!r} column: {header}")

    total, count = column("Total Time (ns)", "Total Time"), column("Instances")
    avg = column("Avg (ns)", "Average (ns)", "Average")
    med = column("Med (ns)", "Median (ns)", "Median", "Avg (ns)", "Average (ns)", "Average")  # old nsys: no median
    low, high = column("Min (ns)", "Minimum (ns)", "Minimum"), column("Max (ns)", "Maximum (ns)", "Maximum")
    name = column("Name")
    kernels = []
    for row in rows[1:]:
        if len(row) <= name:
            continue
        values = [_number(row[i]) for i in (total, count, avg, med, low, high)]
        if any(value is None for value in values):
            continue
        kernels.append(NsysKernel(row[name], values[0], int(values[1]), *values[2:]))
    return kernels


@dataclass
class NcuLaunch:
    """One profiled kernel launch from ncu: metric name -> value (times converted to ns)."""

    launch_id: int
    kernel: str
    block_size: str = ""
    grid_size: str = ""
    metrics: dict[str, float] = field(default_factory=dict)


_TIME_UNITS_NS = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6,
                  "second": 1e9, "s": 1e9}


def parse_ncu_csv(text: str) -> list[NcuLaunch]:
    """Launches from `ncu --csv` (details page: one row per metric) in launch order.

    Also accepts the raw page (one row per launch, metrics as columns, a units row second).
    Lines before the header (==PROF== banners, program output) are skipped.
    """
    rows = _csv_from(text, ('"ID"', "ID,"))
    if not rows:
        return []
    header = rows[0]
    if "Metric Name" in header:
        return _parse_ncu_details(header, rows[1:])
    return _parse_ncu_raw(header, rows[1:])


def _parse_ncu_details(header: list[str], rows: list[list[str]]) -> list[NcuLaunch]:
    col = {name: header.index(name) for name in header}
    launches: dict[int, NcuLaunch] = {}
    for row in rows:
        if len(row) < len(header):
            continue
        launch_id = int(_number(row[col["ID"]]) or 0)
        launch = launches.setdefault(launch_id, NcuLaunch(
            launch_id, row[col["Kernel Name"]],
            row[col["Block Size"]] if "Block Size" in col else "", row[col["Grid Size"]] if "Grid Size" in col else "",
        ))
        value = _number(row[col["Metric Value"]])
        metric = row[col["Metric Name"]]
        if value is None or not metric:
            continue
        unit = row[col["Metric Unit"]] if "Metric Unit" in col else ""
        launch.metrics[metric] = value * _TIME_UNITS_NS.get(unit, 1.0)
    return [launches[key] for key in sorted(launches)]


def _parse_ncu_raw(header: list[str], rows: list[list[str]]) -> list[NcuLaunch]:
    col = {name: header.index(name) for name in header}
    if "Kernel Name" not in col:
        raise ValueError(f"ncu CSV has no 'Kernel Name' column: {header[:8]}")
    units: list[str] = []
    launches = []
    for row in rows:
        if len(row) < len(header):
            continue
        if _number(row[col["ID"]]) is None:  # the units row
            units = row
            continue
        launch = NcuLaunch(int(_number(row[col["ID"]])), row[col["Kernel Name"]],
                           row[col["Block Size"]] if "Block Size" in col else "",
                           row[col["Grid Size"]] if "Grid Size" in col else "")
        for name, index in col.items():
            if "__" not in name:  # metric names look like unit__counter.rollup
                continue
            value = _number(row[index])
            if value is not None:
                unit = units[index] if index < len(units) else ""
                launch.metrics[name] = value * _TIME_UNITS_NS.get(unit, 1.0)
        launches.append(launch)
    return launches


def short_kernel_name(name: str, keep_templates: bool = False) -> str:
    """The one kernel-name shortener. 'void ns::(anonymous namespace)::verify_ballot<(int)32>(const long *, int)'
    -> 'verify_ballot' for tables; with keep_templates, 'ns::verify_ballot<(int)32>' (the ptxas report tells
    template instances apart)."""
    text = name.strip().replace("(anonymous namespace)::", "")
    if text.startswith("void "):
        text = text[len("void "):]
    depth, cut = 0, len(text)
    for index, char in enumerate(text):  # drop the argument list: the first '(' at template depth 0
        if char == "<":
            depth += 1
        elif char == ">":
            depth = max(depth - 1, 0)
        elif char == "(" and depth == 0 and index > 0:
            cut = index
            break
    text = text[:cut].strip()
    if keep_templates:
        return text or name
    while "<" in text:  # drop template arguments, innermost first
        stripped = re.sub(r"<[^<>]*>", "", text)
        if stripped == text:
            break
        text = stripped
    return text.rsplit("::", 1)[-1].strip() or name
