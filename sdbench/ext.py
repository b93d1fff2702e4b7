"""JIT build of csrc/ into the `torch.ops.sdbench` custom ops: the only build code in sdbench.

- Sources: every csrc/*.cu (pure CUDA: kernels and raw-pointer launchers) plus csrc/bindings.cpp (the
  one torch-aware file), compiled by ninja in parallel through `torch.utils.cpp_extension.load`.
- Cache: $TORCH_EXTENSIONS_DIR, else /tmp/sdbench-extensions-<user>; one build folder per torch / CUDA
  version and arch list, so a cache shared between machines never hands out a stale binary.
- Arch: $TORCH_CUDA_ARCH_LIST when set, else the current device's compute capability only (written into
  the environment, which is where torch's build reads it).
- Failure: a failed build is reported once (a RuntimeWarning carrying the compiler's error, trimmed) and
  remembered; `unavailable_reason()` returns it, every CUDA implementation is unavailable with that
  reason, and only `load()` raises (SdbenchError), so the CLI never crashes on a broken toolchain.
- Host compiler: torch links with $CXX (else `c++`). A compiler that links libstdc++ statically into
  shared libraries (seen on the H100 image: CXX=/opt/gcc/bin/g++) gives the extension its own C++
  runtime, and the first TORCH_CHECK error thrown across into torch's libraries segfaults the process.
  A tiny probe library detects that, and the build then uses a compiler from PATH that links the
  shared runtime.
- `ptxas_report()`: registers, shared memory, stack and spills per kernel. torch's build discards ptxas
  output on success and compiles nothing on a cache hit, so the report compiles each .cu with nvcc
  itself (cached by the hash of the sources, flags, arch and nvcc version).
- `tool_library()`: a csrc/tools/ source as a shared library for a tool that calls its kernels through ctypes
  (the chain floors), cached the same way; never part of the extension.
"""

from __future__ import annotations

import functools
import getpass
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from sdbench.errors import SdbenchError
from sdbench.measure import tools

CSRC_DIR = Path(__file__).resolve().parent.parent / "csrc"
EXTENSION_NAME = "sdbench_cuda"
NVCC_FLAGS = ("-O3", "--ptxas-options=-v", "-lineinfo")
REPORT_NVCC_FLAGS = ("-O3", "-std=c++17", "--ptxas-options=-v", "-lineinfo")
MAX_REASON_CHARS = 2000

_lock = threading.Lock()
_build_attempted = False
_build_failure: str | None = None


# --- locations -----------------------------------------------------------------------------------
def cu_sources() -> list[Path]:
    """The pure-CUDA sources (what CI compiles with nvcc alone)."""
    return sorted(CSRC_DIR.glob("*.cu"))


def sources() -> list[Path]:
    return [*cu_sources(), CSRC_DIR / "bindings.cpp"]


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry (containers): the uid is unique enough
        return str(os.getuid())


def cache_root() -> Path:
    """$TORCH_EXTENSIONS_DIR, else a per-user folder under the system temp dir."""
    configured = os.environ.get("TORCH_EXTENSIONS_DIR")
    if configured:
        return Path(configured)
    return Path(tempfile.gettempdir()) / f"sdbench-extensions-{_user()}"


def nvcc_path() -> str | None:
    """The nvcc torch's build would use: $CUDA_HOME/bin, $CUDA_PATH/bin, PATH, /usr/local/cuda/bin."""
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")):
        if root and (Path(root) / "bin" / "nvcc").is_file():
            return str(Path(root) / "bin" / "nvcc")
    found = shutil.which("nvcc")
    if found:
        return found
    fallback = Path("/usr/local/cuda/bin/nvcc")
    return str(fallback) if fallback.is_file() else None


def default_arch_list() -> str | None:
    """The current device's compute capability as TORCH_CUDA_ARCH_LIST spells it ("9.0"), or None."""
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    return f"{major}.{minor}"


def arch_list() -> str | None:
    return os.environ.get("TORCH_CUDA_ARCH_LIST") or default_arch_list()


def build_directory(arch: str) -> Path:
    tag = re.sub(r"[^A-Za-z0-9.]+", "_", f"torch{torch.__version__}-cu{torch.version.cuda}-arch{arch}")
    return cache_root() / f"{EXTENSION_NAME}-{tag}"


# --- build ---------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _precondition_failure() -> str | None:
    """Why no build can even start here, or None (cached: probes call this for every config)."""
    if getattr(torch.version, "hip", None):
        return "ROCm torch: sdbench's kernels need a CUDA build of torch"
    if torch.version.cuda is None:
        return f"CUDA torch not installed (torch {torch.__version__} is a CPU build)"
    if not torch.cuda.is_available():
        return "no CUDA device"
    if nvcc_path() is None:
        return "nvcc not found: set CUDA_HOME or put nvcc on PATH"
    return None


def trim_build_error(text: str, max_chars: int = MAX_REASON_CHARS) -> str:
    """The compiler's error lines (with the line after each), else the output's tail, capped."""
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    keep: list[str] = []
    for index, line in enumerate(lines):
        if re.search(r"\berror\b|fatal", line, re.IGNORECASE):
            keep.extend(lines[index : index + 2])
    if not keep:
        keep = lines[-20:]
    deduped = list(dict.fromkeys(keep))
    trimmed = "\n".join(deduped)
    return trimmed if len(trimmed) <= max_chars else trimmed[: max_chars - 4] + " ..."


def embeds_cxx_runtime(cxx: str) -> bool:
    """Whether `cxx` links libstdc++ statically into a shared library (probe: a library that throws
    and does not list libstdc++.so among its needed libraries). False when it cannot tell."""
    with tempfile.TemporaryDirectory(prefix="sdbench-cxx-probe-") as scratch:
        source, library = Path(scratch) / "probe.cpp", Path(scratch) / "probe.so"
        source.write_text("int sdbench_probe(int x) { if (x) throw x; return 0; }\n")
        try:
            done = subprocess.run([*shlex.split(cxx), "-shared", "-fPIC", str(source), "-o", str(library)],
                                  capture_output=True, timeout=120)
        except (OSError, subprocess.SubprocessError):
            return False
        return done.returncode == 0 and b"libstdc++.so" not in library.read_bytes()


@functools.lru_cache(maxsize=1)
def host_compiler() -> str:
    """The C++ compiler the build links with: $CXX (else c++), unless it embeds its own C++ runtime
    and a compiler on PATH does not."""
    configured = os.environ.get("CXX") or "c++"
    if not embeds_cxx_runtime(configured):
        return configured
    for name in ("g++", "c++", "clang++"):
        candidate = shutil.which(name)
        if candidate and not embeds_cxx_runtime(candidate):
            return candidate
    return configured  # nothing better: errors raised by the ops may then crash (see the module doc)


def _build() -> None:
    from torch.utils import cpp_extension

    arch = arch_list()
    if not os.environ.get("TORCH_CUDA_ARCH_LIST") and arch:
        os.environ["TORCH_CUDA_ARCH_LIST"] = arch  # torch's build reads the arch list from here only
    directory = build_directory(arch or "default")
    directory.mkdir(parents=True, exist_ok=True)
    previous_cxx = os.environ.get("CXX")
    os.environ["CXX"] = host_compiler()  # torch's build reads the host compiler from here only
    try:
        _load_with_torch(cpp_extension, directory)
    finally:
        if previous_cxx is None:
            os.environ.pop("CXX", None)
        else:
            os.environ["CXX"] = previous_cxx


def _load_with_torch(cpp_extension, directory: Path) -> None:
    cpp_extension.load(
        name=EXTENSION_NAME,
        sources=[str(path) for path in sources()],
        extra_cflags=["-O3"],
        extra_cuda_cflags=list(NVCC_FLAGS),
        extra_include_paths=[str(CSRC_DIR)],
        build_directory=str(directory),
        verbose=os.environ.get("SDBENCH_BUILD_VERBOSE", "") not in ("", "0"),
        is_python_module=False,  # the library registers torch.ops.sdbench when loaded
    )


def unavailable_reason() -> str | None:
    """None when torch.ops.sdbench is ready (building it on first call); else why not. Cached."""
    global _build_attempted, _build_failure
    reason = _precondition_failure()
    if reason is not None:
        return reason
    with _lock:
        if not _build_attempted:
            _build_attempted = True
            try:
                _build()
            except Exception as err:  # any toolchain failure becomes a reason, never a crash
                _build_failure = f"extension failed to build: {trim_build_error(str(err))}"
                warnings.warn(f"sdbench: CUDA {_build_failure}", RuntimeWarning, stacklevel=2)
    return _build_failure


extension_unavailable_reason = unavailable_reason


def load():
    """The `torch.ops.sdbench` namespace, built on first use; SdbenchError with the reason otherwise."""
    reason = unavailable_reason()
    if reason is not None:
        raise SdbenchError(f"sdbench's CUDA kernels are unavailable: {reason}")
    return torch.ops.sdbench


# --- ptxas report --------------------------------------------------------------------------------
@dataclass(frozen=True)
class CompileResult:
    source: str
    returncode: int
    output: str


def arch_flag(arch: str) -> str:
    """'9.0' / '9.0a' / 'sm_90' -> 'sm_90' / 'sm_90a' / 'sm_90' (the first entry of a list)."""
    first = re.split(r"[;\s,]+", arch.strip())[0].replace("+PTX", "")
    if first.startswith("sm_"):
        return first
    return "sm_" + first.replace(".", "")


def _required_nvcc() -> str:
    nvcc = nvcc_path()
    if nvcc is None:
        raise SdbenchError("nvcc not found: set CUDA_HOME or put nvcc on PATH")
    return nvcc


def compile_sources(arch: str = "sm_90", out_dir: str | Path | None = None,
                    paths: list[Path] | None = None) -> list[CompileResult]:
    """nvcc -c each csrc/*.cu for arch with ptxas -v, in parallel; never raises on a compile error."""
    nvcc = _required_nvcc()
    paths = paths if paths is not None else cu_sources()
    with tempfile.TemporaryDirectory(prefix="sdbench-ptxas-") as scratch:
        target = Path(out_dir) if out_dir is not None else Path(scratch)

        def compile_one(path: Path) -> CompileResult:
            command = [nvcc, f"-arch={arch_flag(arch)}", *REPORT_NVCC_FLAGS, f"-I{CSRC_DIR}", "-c", str(path),
                       "-o", str(target / f"{path.stem}.o")]
            done = subprocess.run(command, capture_output=True, text=True)
            return CompileResult(path.name, done.returncode, done.stdout + done.stderr)

        with ThreadPoolExecutor(max_workers=max(1, min(len(paths), os.cpu_count() or 1))) as pool:
            return list(pool.map(compile_one, paths))


_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(\w+)'")
_PROPERTIES = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_BARRIERS = re.compile(r"used (\d+) barriers")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas(text: str, source: str | None = None) -> list[dict]:
    """One dict per kernel from `ptxas -v` output: kernel (demangled, arguments dropped), mangled,
    source, arch, registers, shared_bytes, barriers, stack_bytes, spill_store_bytes, spill_load_bytes."""
    kernels: dict[str, dict] = {}
    current: dict | None = None
    properties_of: str | None = None
    for line in text.splitlines():
        if match := _ENTRY.search(line):
            current = kernels.setdefault(match.group(1), {
                "kernel": match.group(1), "mangled": match.group(1), "source": source, "arch": match.group(2),
                "registers": 0, "shared_bytes": 0, "barriers": 0,
                "stack_bytes": 0, "spill_store_bytes": 0, "spill_load_bytes": 0,
            })
        elif match := _PROPERTIES.search(line):
            properties_of = match.group(1)
        elif (match := _FRAME.search(line)) and properties_of in kernels:
            record = kernels[properties_of]
            record["stack_bytes"], record["spill_store_bytes"], record["spill_load_bytes"] = map(int, match.groups())
        elif (match := _USED.search(line)) and current is not None:
            current["registers"] = int(match.group(1))
            if smem := _SMEM.search(line):
                current["shared_bytes"] = int(smem.group(1))
            if barriers := _BARRIERS.search(line):
                current["barriers"] = int(barriers.group(1))
    records = list(kernels.values())
    for record, name in zip(records, demangle([r["mangled"] for r in records]), strict=True):
        record["kernel"] = tools.short_kernel_name(name, keep_templates=True)
    return records


def demangle(names: list[str]) -> list[str]:
    """Itanium-demangled names through cu++filt or c++filt; the names unchanged when neither exists."""
    if not names:
        return []
    nvcc = nvcc_path()
    tools = [str(Path(nvcc).parent / "cu++filt")] if nvcc else []
    tools.append("c++filt")
    for tool in tools:
        if shutil.which(tool) is None and not Path(tool).is_file():
            continue
        try:
            done = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            continue
        lines = done.stdout.splitlines()
        if done.returncode == 0 and len(lines) == len(names):
            return lines
    return list(names)


def _build_key(nvcc: str, arch: str, flags: tuple[str, ...], sources: list[Path]) -> str:
    """A cache key for what nvcc builds from sources: its version, the arch, the flags and every source's bytes."""
    digest = hashlib.sha256()
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    digest.update(f"{version}|{arch}|{flags}".encode())
    for path in sources:
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()[:20]


def ptxas_report(arch: str | None = None) -> list[dict]:
    """Per-kernel resources of every csrc/*.cu for arch (default: the build's arch, else sm_90).

    Raises SdbenchError when nvcc is missing or a source does not compile (with the compiler's error).
    """
    nvcc = _required_nvcc()
    arch = arch_flag(arch or arch_list() or "sm_90")
    key = _build_key(nvcc, arch, REPORT_NVCC_FLAGS, sorted(CSRC_DIR.glob("*.cu*")))
    cache_file = cache_root() / f"ptxas-report-{key}.json"
    if cache_file.is_file():
        return json.loads(cache_file.read_text())
    records: list[dict] = []
    for result in compile_sources(arch):
        if result.returncode != 0:
            raise SdbenchError(f"{result.source} does not compile for {arch}:\n{trim_build_error(result.output)}")
        records.extend(parse_ptxas(result.output, result.source))
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    cache_file.write_text(json.dumps(records, indent=1))
    return records


TOOL_NVCC_FLAGS = ("-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC")


def tool_library(source: Path, arch: str | None = None) -> Path:
    """A csrc/tools/ source as a shared library (nvcc alone, no torch headers; its kernels are called through
    ctypes), built once per source, flags, arch and nvcc version under cache_root(). Concurrent builds (xdist
    workers) each write their own scratch file and rename it into place, so none loads a half-written library.
    Raises SdbenchError when nvcc is missing or the source does not compile."""
    nvcc = _required_nvcc()
    arch = arch_flag(arch or arch_list() or "sm_90")
    path = cache_root() / f"{source.stem}-{_build_key(nvcc, arch, TOOL_NVCC_FLAGS, [source])}.so"
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(f"{path.stem}.{os.getpid()}.tmp.so")
    done = subprocess.run([nvcc, f"-arch={arch}", *TOOL_NVCC_FLAGS, str(source), "-o", str(scratch)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        scratch.unlink(missing_ok=True)
        raise SdbenchError(f"building {source.name} failed:\n{trim_build_error(done.stdout + done.stderr)}")
    os.replace(scratch, path)
    return path
