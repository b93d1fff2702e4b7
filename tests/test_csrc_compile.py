"""Every csrc/*.cu compiles for sm_90 with nvcc alone (no torch headers) and no kernel spills registers.

CI has nvcc but no GPU: this is what catches a syntax error or a register-pressure regression in a
kernel before anyone reaches a GPU. The sources compile in parallel (about 20 s on 2 cores).
"""

import shutil
import subprocess

import pytest

from sdbench import ext

pytestmark = pytest.mark.skipif(ext.nvcc_path() is None and shutil.which("nvcc") is None,
                                reason="nvcc not found (CUDA toolkit absent)")


@pytest.fixture(scope="module")
def compiled():
    return ext.compile_sources("sm_90")


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    """csrc/tools/tile_shape_probe.cu built on the host: the tile rule of csrc/verify_pack_scan.cu, no GPU."""
    nvcc = ext.nvcc_path() or shutil.which("nvcc")
    path = tmp_path_factory.mktemp("probe") / "tile_shape_probe"
    built = subprocess.run([nvcc, "-std=c++17", "-arch=sm_90", f"-I{ext.CSRC_DIR}",
                            str(ext.CSRC_DIR / "tools" / "tile_shape_probe.cu"), "-o", str(path)],
                           capture_output=True, text=True)
    assert built.returncode == 0, ext.trim_build_error(built.stdout + built.stderr)
    return path


def test_every_source_compiles(compiled):
    assert {result.source for result in compiled} == {path.name for path in ext.cu_sources()}
    for result in compiled:
        assert result.returncode == 0, f"{result.source}:\n{ext.trim_build_error(result.output)}"


def test_no_kernel_spills_registers(compiled):
    kernels = [k for result in compiled for k in ext.parse_ptxas(result.output, result.source)]
    assert kernels, "ptxas -v reported no kernels"
    spilling = [k for k in kernels if k["spill_store_bytes"] or k["spill_load_bytes"] or k["stack_bytes"]]
    assert not spilling, spilling


def test_every_source_defines_a_kernel(compiled):
    for result in compiled:
        assert ext.parse_ptxas(result.output, result.source), f"{result.source} defines no kernel"


def test_the_scan_timeline_tool_compiles():
    """csrc/tools/scan_timeline.cu builds verify_pack_scan.cu with its timeline marks (`make scan-timeline`,
    docs/perf-notes.md, session 13): it must keep compiling as the kernel changes. The marks take registers: since
    session 14's four ways of finding a unit's source, the kernel the tool times (fused, int64 tokens, 16-byte
    units) spills 12 bytes (20 loaded back) and pack_scan's (then built, never timed) 24; the extension's build spills
    none (the test above). No arrangement of the marks tried removed it without changing the shipped kernel, so
    the bound is the largest spill of a timed kernel today, and any growth fails: since session 45's tiles in pairs,
    fused's 16-byte kernel that scans in shared memory spills 16 bytes (40 loaded back, 8 of stack), its warp-scan
    kernel (the one the scale-kv timelines time) none. pack_scan's, which session 45's timeline timed, spill 4 bytes
    (warp scan) and 28 (shared memory): a caveat on comparing the two kernels' timeline phases."""
    [result] = ext.compile_sources("sm_90", paths=[ext.CSRC_DIR / "tools" / "scan_timeline.cu"])
    assert result.returncode == 0, ext.trim_build_error(result.output)
    kernels = ext.parse_ptxas(result.output, result.source)
    timed = [k for k in kernels if "scan_pack_kernel" in k["kernel"] and "VerifiedLengths" in k["kernel"]]
    assert timed, [k["kernel"] for k in kernels]
    assert not [k for k in timed if k["spill_store_bytes"] > 16 or k["spill_load_bytes"] > 40 or k["stack_bytes"] > 8]


def test_the_tile_rule_loads_late_only_at_one_wave_chunks_of_64_kib(probe):
    """tile_shape (csrc/verify_pack_scan.cu) on the host through csrc/tools/tile_shape_probe.cu: the first copy
    round waits for the look-back at chunks of >= 64 KiB in a grid of one wave of resident blocks (132 SMs x 4),
    never at whole tiles, at 32 KiB chunks or in grids of several waves (docs/perf-notes.md, "Session 18"). On
    the scale-kv grid (fp16 KV) that is exactly three shapes, six configs with both α."""

    def late(*points: str) -> dict[str, int]:
        run = subprocess.run([str(probe), "132", *points], capture_output=True, text=True, check=True)
        return {line.split()[0]: int(line.split("late_loads=")[1].split()[0]) for line in run.stdout.splitlines()}

    assert late("256:32:8192", "32:128:8192", "256:128:2048") == dict.fromkeys(
        ["256:32:8192", "32:128:8192", "256:128:2048"], 1), "one wave of 64-128 KiB chunks"
    assert late("32:32:8192", "256:128:8192", "1024:8:8192", "256:8:8192", "256:32:8192:waves=2",
                "256:32:8192:late=1073741824") == dict.fromkeys(
        ["32:32:8192", "256:128:8192", "1024:8:8192", "256:8:8192", "256:32:8192:waves=2",
         "256:32:8192:late=1073741824"], 0), "32 KiB chunks, several waves, whole tiles, the knob off"
    assert late("32:32:8192:late=32768") == {"32:32:8192:late=32768": 1}, "the knob moves the threshold"
    grid = [f"{b}:{g}:{2 * kv}" for b in (1, 8, 32, 256, 1024, 4096, 16384, 65536) for g in (4, 8, 32, 128)
            for kv in (64, 128, 1024, 4096)]
    assert sorted(point for point, value in late(*grid).items() if value) == [
        "256:128:2048", "256:32:8192", "32:128:8192"]


def test_the_tile_rule_scans_in_warps_up_to_32_sequences_a_tile(probe):
    """tile_shape's warp_scan (csrc/verify_pack_scan.cu): tiles of at most 32 sequences (one a lane) scan their
    lengths in every warp, larger tiles in shared memory, and the scan_mode knob turns it off; read on the host
    through csrc/tools/tile_shape_probe.cu, against the seqs_per_tile the same line reports."""
    grid = [f"{b}:{g}:{2 * kv}" for b in (1, 8, 32, 256, 1024, 4096, 16384, 65536) for g in (4, 8, 32, 128)
            for kv in (64, 128, 1024, 4096)]
    run = subprocess.run([str(probe), "132", *grid, *(f"{p}:scan_mode=1" for p in grid)], capture_output=True,
                         text=True, check=True)
    shapes = {line.split()[0]: dict(field.split("=") for field in line.split()[1:]) for line in run.stdout.splitlines()}
    assert len(shapes) == 2 * len(grid)
    for point in grid:
        seqs = int(shapes[point]["seqs_per_tile"])
        assert shapes[point]["warp_scan"] == ("1" if seqs <= 32 else "0"), (point, shapes[point])
        assert shapes[f"{point}:scan_mode=1"]["warp_scan"] == "0"
        assert shapes[f"{point}:scan_mode=1"]["seqs_per_tile"] == str(seqs), "the knob changes the scan, not the tile"
    counts = {int(shapes[p]["seqs_per_tile"]) for p in grid}
    assert min(counts) == 1 and 2 <= len({c for c in counts if 2 <= c <= 32}) and max(counts) > 32, counts


def test_the_tile_rule_pairs_tiles_only_in_grids_of_several_waves_of_capped_tiles(probe):
    """tile_shape's pairs (csrc/verify_pack_scan.cu, docs/perf-notes.md "Session 45"): by default a launch may take its
    tiles in pairs (when the launch before accepted under half its rows) only where the tiles are whole sequences at
    the 256 KiB cap in more than one wave of resident blocks (132 SMs x 4), and a pair still fits its scan: 32
    sequences a warp scan, and two tiles of at most the cap each. On the scale-kv grid (fp16 KV) that is exactly the
    fifteen shapes below. `pairs=2` pairs wherever a pair fits, whatever the grid; `pairs=1` never; nor does a shape
    with fixed_chunks."""
    grid = [f"{b}:{g}:{2 * kv}" for b in (1, 8, 32, 256, 1024, 4096, 16384, 65536) for g in (4, 8, 32, 128)
            for kv in (64, 128, 1024, 4096)]
    run = subprocess.run([str(probe), "132", *grid, *(f"{p}:pairs=1" for p in grid), *(f"{p}:pairs=2" for p in grid)],
                         capture_output=True, text=True, check=True)
    shapes = {line.split()[0]: dict(field.split("=") for field in line.split()[1:]) for line in run.stdout.splitlines()}
    assert sorted(p for p in grid if shapes[p]["pairs"] != "0") == sorted([
        "4096:8:8192", "4096:32:2048", "16384:4:8192", "16384:8:2048", "16384:8:8192", "16384:32:2048",
        "16384:128:128", "16384:128:256", "65536:4:8192", "65536:8:2048", "65536:8:8192", "65536:32:128",
        "65536:32:2048", "65536:128:128", "65536:128:256"])
    assert {shapes[p]["pairs"] for p in grid} == {"0", "1"}, "by default: by the previous launch's acceptance"
    assert {shapes[f"{p}:pairs=1"]["pairs"] for p in grid} == {"0"}
    for point in grid:
        shape = shapes[f"{point}:pairs=2"]
        seqs, slab = int(shape["seqs_per_tile"]), int(point.split(":")[1]) * int(point.split(":")[2])
        fits = (shape["chunks_per_seq"] == "1" and 2 * seqs <= (32 if shape["warp_scan"] == "1" else 1024)
                and seqs * slab <= 256 * 1024)
        assert shape["pairs"] == ("2" if fits else "0"), (point, shape)
        assert {k: v for k, v in shape.items() if k != "pairs"} == {
            k: v for k, v in shapes[point].items() if k != "pairs"}, "the knob changes the pairing, not the tile"
        if shapes[point]["pairs"] == "1":
            assert fits, point
    assert shapes["65536:32:256:pairs=2"]["pairs"] == "0", "32 sequences a warp scan: a pair would not fit it"
    assert shapes["16384:128:2048:pairs=2"]["pairs"] == "0", "two-sequence tiles of large slabs are over the cap"
    fixed = subprocess.run([str(probe), "132", "600:128:2048:fixed_chunks=1", "600:128:2048:fixed_chunks=1:pairs=2",
                            "600:128:2048"], capture_output=True, text=True, check=True).stdout.split()
    assert [f for f in fixed if f.startswith("pairs=")] == ["pairs=0", "pairs=0", "pairs=1"], \
        "fixed_chunks copies at most a slab per one-sequence tile: never in pairs"
