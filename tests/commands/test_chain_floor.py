"""The chain-floor tool (sdbench/commands/chain_floor.py, csrc/tools/chain_floor.cu): its parsers, bars and the torch
pick its race floor is checked against, here; the floor kernels themselves against the references in
tests/gpu/test_chain_floor_gpu.py."""

import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from sdbench import ext
from sdbench.commands import chain_floor
from sdbench.errors import SdbenchError
from sdbench.ops.prob_verify_logits.workload import LogitsConfig
from sdbench.ops.workload import VerifyConfig

NO_NVCC = pytest.mark.skipif(ext.nvcc_path() is None, reason="nvcc not found (CUDA toolkit absent)")


@NO_NVCC
def test_the_floor_kernels_compile_without_spills():
    [result] = ext.compile_sources("sm_90", paths=[chain_floor.SOURCE])
    assert result.returncode == 0, ext.trim_build_error(result.output)
    kernels = ext.parse_ptxas(result.output, result.source)
    names = {kernel["kernel"].split("<")[0].rsplit("::", 1)[-1] for kernel in kernels}
    assert {"copy_kernel", "gather_kernel", "rows_max_kernel", "race_kernel"} <= names, names
    assert not [k for k in kernels if k["spill_store_bytes"] or k["spill_load_bytes"] or k["stack_bytes"]]


def _cuobjdump() -> str | None:
    """cuobjdump beside nvcc, on PATH, or the one Triton ships (its CUDA backend's bin/)."""
    nvcc = ext.nvcc_path()
    candidates = [] if nvcc is None else [Path(nvcc).resolve().parent / "cuobjdump"]
    on_path = shutil.which("cuobjdump")
    candidates += [Path(on_path)] if on_path else []
    try:
        import triton

        candidates.append(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump")
    except ImportError:
        pass
    return next((str(path) for path in candidates if path.exists()), None)


@NO_NVCC
def test_the_floors_pass_one_and_race_issue_every_load_before_their_first_fold(tmp_path):
    """A floor's thread issues all its loads before it folds any (session 35: with a branch around each unit's fold,
    ptxas sank loads behind the folds before them, and the bf16 floors ran 0.5-1.5 µs slower): in the SASS of every
    rows_max_kernel and race_kernel instantiation, no branch comes between the first 16-byte load and the last."""
    cuobjdump = _cuobjdump()
    if cuobjdump is None:
        pytest.skip("cuobjdump not found beside nvcc, on PATH or in Triton's CUDA backend")
    [result] = ext.compile_sources("sm_90", out_dir=tmp_path, paths=[chain_floor.SOURCE])
    assert result.returncode == 0, ext.trim_build_error(result.output)
    sass = subprocess.run([cuobjdump, "-sass", str(tmp_path / f"{chain_floor.SOURCE.stem}.o")], capture_output=True,
                          text=True, check=True).stdout
    kernels = re.split(r"\n\s*Function : ", sass)[1:]
    checked = 0
    for kernel in kernels:
        name = kernel.split("\n", 1)[0]
        if "rows_max_kernel" not in name and "race_kernel" not in name:
            continue
        lines = [line for line in kernel.splitlines() if re.search(r"/\*[0-9a-f]{4}\*/", line)]
        loads = [i for i, line in enumerate(lines) if "LDG.E.128" in line]
        assert loads, name
        branches = [i for i in range(loads[0], loads[-1]) if re.search(r"\bBRA\b", lines[i])]
        assert not branches, (name, [lines[i].strip() for i in branches])
        checked += 1
    assert checked >= 8, checked  # two element types, two unit counts, two kernels


@NO_NVCC
def test_the_library_builds_once_and_loads_without_a_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    first = ext.tool_library(chain_floor.SOURCE)
    assert ext.tool_library(chain_floor.SOURCE) == first and first.parent == tmp_path
    assert [path.name for path in tmp_path.iterdir()] == [first.name]  # no scratch file left behind
    lib = chain_floor.library()  # loading calls nothing on the device
    assert lib.chain_floor_gather.restype is not None


def test_points_parse_to_the_grids_workloads():
    assert chain_floor.parse_kv("16384:4:0.3:128,1:8:0.9:64") == [
        VerifyConfig(batch_size=16384, gamma=4, alpha=0.3, kv_dim=128), VerifyConfig(1, 8, 0.9, kv_dim=64)]
    assert chain_floor.parse_logits("32:4:32000:bf16,1:16:128256:fp32") == [
        LogitsConfig(32, 4, 32000, "bfloat16"), LogitsConfig(1, 16, 128256, "float32")]
    with pytest.raises(SdbenchError, match="bf16 or fp32"):
        chain_floor.parse_logits("32:4:32000:fp16")


@pytest.mark.parametrize(("kv", "logits", "message"), [
    ("16:3:0.3:128", "", "γ must be a power of two"),
    ("16:4:0.3:96", "", "16-byte units must be a power of two"),
    ("16:4:0.3", "", "a point is batch:γ:α:kv_dim"),
    ("16:4:x:64", "", "bad point"),
    ("", "32:64:32000:bf16", "γ <= 32"),
    ("", "4096:16:32000:bf16", "at most 65535 rows"),
    ("", "4:4:32001:bf16", "whole 16-byte units"),
])
def test_points_the_floor_kernels_cannot_take_are_refused_before_any_gpu_work(kv, logits, message):
    with pytest.raises(SdbenchError, match=message):
        chain_floor.parse_kv(kv)
        chain_floor.parse_logits(logits)


def test_l2_states_are_cold_or_warm():
    assert chain_floor.parse_l2("cold,warm") == ["cold", "warm"]
    for bad in ("", "cold,hot"):
        with pytest.raises(SdbenchError, match="--l2"):
            chain_floor.parse_l2(bad)


def test_rows_and_slabs_must_be_powers_of_two():
    assert chain_floor.log2_exact(1, "x") == 0 and chain_floor.log2_exact(512, "x") == 9
    for bad in (0, 3, 96):
        with pytest.raises(SdbenchError, match="power of two"):
            chain_floor.log2_exact(bad, "x")


def test_the_bars_are_the_issues():
    """Pinned to the committed reports' numbers, which the report and logits_summary computed themselves."""
    # #17: 5.03 MB accepted at 2844.1 GB/s is the report's 3.54 µs floor (scale-kv report, b=16384 γ=4 α=0.3 kv=128)
    floor, bar = chain_floor.kv_bar_us(5_030_000, 2844.1)
    assert floor == pytest.approx(3.537, abs=1e-3) and bar == pytest.approx(1.3 * floor + 2)
    # #18: b=32, γ=4, V=32000 bf16 is 18.43 MB of logits; at 2.931 TB/s that is session 31's 6.29 µs floor
    floor, bar = chain_floor.logits_bar_us(LogitsConfig(32, 4, 32000, "bfloat16"), 2.931)
    assert floor == pytest.approx(6.288, abs=1e-3) and bar == pytest.approx(1.3 * floor + 3)


def test_the_fastest_launch_shape_is_the_floor():
    medians = {"copy[1]": 5.0, "copy[4]": 4.5, "gather[2]": 6.0, "fused": 3.0}
    assert chain_floor.best_of(medians, "copy") == ("copy[4]", 4.5)
    assert chain_floor.best_of(medians, "speculative") is None


def picks_by_loops(target: torch.Tensor, draft: torch.Tensor) -> list[int]:
    """The race floor's rule, one sequence and one row at a time."""
    gamma = draft.shape[1]
    picks = []
    for b in range(target.shape[0]):
        k = next((j for j in range(gamma) if float(target[b, j].float().max()) < float(draft[b, j].float().max())),
                 gamma)
        values = target[b, k].float() - (draft[b, k].float() if k < gamma else 0)
        best = max(range(values.numel()), key=lambda i: (float(values[i]), -i))
        picks.append(best)
    return picks


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_race_floors_expected_pick_is_the_rule(dtype):
    gen = torch.Generator().manual_seed(3)
    target = torch.randn((6, 4, 257), generator=gen)
    # draft rows below the target's maximum pass the floor's test, rows above it stop the sequence: sequence 0
    # passes every row (k = γ, the bonus row alone), the others stop at j = b % 3
    scale = torch.full((6, 3, 1), 0.5)
    for b in range(1, 6):
        scale[b, b % 3] = 2.0
    draft = target[:, :3] * scale + 0.01 * torch.randn((6, 3, 257), generator=gen)
    workload = SimpleNamespace(target_logits=target.to(dtype), draft_logits=draft.to(dtype))
    want = picks_by_loops(workload.target_logits, workload.draft_logits)
    assert chain_floor.expected_picks(workload).tolist() == want
    assert want[0] == int(target[0, 3].to(dtype).float().argmax())  # the bonus row's own argmax


@pytest.mark.parametrize(("temperatures", "period"), [
    ((0.0, 0.7, 1.0, 1.3), 4), ((0.0, 1.0), 2), ((0.7, 1.0), 0), ((0.7, 0.0), 0), ((0.0,), 0)])
def test_the_sampled_floors_run_where_greedy_requests_fall_every_pth(temperatures, period):
    """Request s greedy iff s % P == 0 (a cycle starting at 0 with no other 0): the sampled floors' arithmetic
    mapping holds. Other patterns (none greedy, greedy at odd s, all greedy) get no sampled floors."""
    from sdbench.ops import make_workload

    workload = make_workload("prob_verify_logits", LogitsConfig(9, 4, 64, "float32", temperatures=temperatures), "cpu")
    assert chain_floor.greedy_period(workload) == period


def test_the_block_rule_gets_no_sampled_floors():
    """Under the block rule fused_logits reads a greedy request's draft rows too, so the sampled pair is no floor."""
    from sdbench.ops import make_workload

    workload = make_workload("prob_verify_logits", LogitsConfig(8, 4, 64, "float32", rule="block"), "cpu")
    assert chain_floor.greedy_period(workload) == 0
