"""Chain floors: the least GPU time a design class can take at a point of issue #17's or #18's grid, measured with
kernels that do strictly less than any correct kernel of that class (csrc/tools/chain_floor.cu says what each
leaves out), beside the shipped kernel and the launch floor in the same rotation.

    python -m sdbench.commands.chain_floor --kv 16384:4:0.3:128,1024:128:0.3:64 \
        --logits 32:4:32000:bf16,128:4:32000:bf16 --out floors.json

A --kv point is batch:γ:α:kv_dim (fp16 KV, int64 tokens, binomial lengths: the scale-kv grid's workload); a --logits
point is batch:γ:V:bf16|fp32 (the logits grid's workload). Each floor kernel is checked against the reference (KV:
the packed rows; logits: the pick, recomputed with torch) before it is timed, and its time is the best over its
launch shapes (units a thread). The bars are the issues': #17 1.3 × (2 × accepted bytes / copy ceiling) + 2 µs cold,
#18 1.3 × (logits bytes / copy ceiling) + 3 µs. Times: CUPTI GPU time, the median over --iters calls, per L2 state.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import math
import subprocess
from pathlib import Path

import torch

from sdbench import ext, registry, thresholds
from sdbench.errors import SdbenchError
from sdbench.measure import timing
from sdbench.ops import make_workload
from sdbench.ops.launch_floor import launch_floor
from sdbench.ops.prob_verify_logits.workload import LogitsConfig, logits_read_floor_bytes
from sdbench.ops.verify_pack.reference import verify_pack
from sdbench.ops.workload import VerifyConfig

SOURCE = ext.CSRC_DIR / "tools" / "chain_floor.cu"
KV_BAR_SCALE, KV_BAR_US = 1.3, 2.0  # report.KV_FLOOR_BAR_*: #17's bar
LOGITS_BAR_SCALE, LOGITS_BAR_US = 1.3, 3.0  # logits_summary.bar_us: #18's bar
UNIT = 16  # bytes a thread moves per load
KV_SHAPES = (1, 2, 4)  # units a thread for gather and speculative; copy also 8
LOGITS_SHAPES = ((4, 2), (4, 4), (8, 2), (8, 4))  # (rows_max, race) units a thread


def library(arch: str = "sm_90") -> ctypes.CDLL:
    """csrc/tools/chain_floor.cu as a shared library, built once per source and arch under ext.cache_root()."""
    nvcc = ext.nvcc_path()
    if nvcc is None:
        raise SdbenchError("nvcc not found: the chain floors are built with nvcc (set CUDA_HOME or PATH)")
    digest = hashlib.sha256(SOURCE.read_bytes() + arch.encode()).hexdigest()[:16]
    path = ext.cache_root() / f"chain_floor-{digest}.so"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch = path.with_suffix(".tmp.so")
        done = subprocess.run([nvcc, "-O3", "-std=c++17", f"-arch={arch}", "-shared", "-Xcompiler", "-fPIC",
                               str(SOURCE), "-o", str(scratch)], capture_output=True, text=True)
        if done.returncode != 0:
            raise SdbenchError(f"building {SOURCE.name} failed:\n{ext.trim_build_error(done.stdout + done.stderr)}")
        scratch.rename(path)
    lib = ctypes.CDLL(str(path))
    pointer, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.chain_floor_copy.argtypes = [pointer, pointer, i64, i32, pointer]
    lib.chain_floor_gather.argtypes = [pointer, pointer, pointer, i64, i32, i32, i32, i32, pointer]
    lib.chain_floor_two_pass.argtypes = [pointer, pointer, pointer, pointer, i32, i32, i32, i32, i32, i32, i32,
                                         pointer]
    for function in (lib.chain_floor_copy, lib.chain_floor_gather, lib.chain_floor_two_pass):
        function.restype = ctypes.c_int
    return lib


def _stream() -> ctypes.c_void_p:
    return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)


def _checked(status: int, what: str) -> None:
    if status != 0:
        raise SdbenchError(f"{what}: CUDA error {status}")


def log2_exact(value: int, what: str) -> int:
    """log2(value) for a power of two: the floor kernels find a unit's row and sequence by shifts."""
    if value < 1 or value & (value - 1):
        raise SdbenchError(f"{what} must be a power of two for the chain floors, got {value}")
    return value.bit_length() - 1


# --- #17 ----------------------------------------------------------------------------------------------
def kv_floor_runs(lib: ctypes.CDLL, workload, expected: dict[str, torch.Tensor]) -> dict[str, callable]:
    """copy[u], gather[u] and speculative[u] at workload, each checked against the reference's packed rows."""
    draft_kv = workload.draft_kv
    batch, gamma, kv_dim = draft_kv.shape
    row_bytes = kv_dim * draft_kv.element_size()
    if row_bytes % UNIT:
        raise SdbenchError(f"rows of {row_bytes} bytes are not whole 16-byte units")
    log_row = log2_exact(row_bytes // UNIT, "a row's units")
    log_slab = log_row + log2_exact(gamma, "γ")
    total_rows = int(expected["accepted_lengths"].sum())
    want = expected["packed_kv"][:total_rows]
    accepted = want.contiguous().clone()  # the copy's source: the accepted bytes as one run
    length_offset = torch.stack([expected["accepted_lengths"], expected["packed_offsets"]], dim=1).contiguous()
    drafted_units = batch * gamma * row_bytes // UNIT
    accepted_units = total_rows * row_bytes // UNIT
    runs = {}

    def checked_run(name: str, launch, out: torch.Tensor) -> None:
        out.fill_(-1)  # poison: a row it does not write fails the check
        launch()
        torch.cuda.synchronize()
        if not torch.equal(out[:total_rows], want):
            raise SdbenchError(f"{name} did not pack the reference's rows")
        runs[name] = launch

    for per_thread in (*KV_SHAPES, 8):
        out = torch.empty_like(draft_kv).view(batch * gamma, kv_dim)

        def copy(out=out, per_thread=per_thread):
            _checked(lib.chain_floor_copy(accepted.data_ptr(), out.data_ptr(), accepted_units, per_thread, _stream()),
                     "copy")
        checked_run(f"copy[{per_thread}]", copy, out)
    for speculative in (False, True):
        for per_thread in KV_SHAPES:
            out = torch.empty_like(draft_kv).view(batch * gamma, kv_dim)

            def gather(out=out, per_thread=per_thread, speculative=speculative):
                _checked(lib.chain_floor_gather(draft_kv.data_ptr(), length_offset.data_ptr(), out.data_ptr(),
                                                drafted_units, log_row, log_slab, per_thread, int(speculative),
                                                _stream()), "gather")
            checked_run(f"{'speculative' if speculative else 'gather'}[{per_thread}]", gather, out)
    return runs


def kv_bar_us(accepted_bytes: int, ceiling_gbps: float) -> tuple[float, float]:
    """(#17's copy floor, its bar), µs."""
    floor = 2 * accepted_bytes / ceiling_gbps / 1e3
    return floor, KV_BAR_SCALE * floor + KV_BAR_US


# --- #18 ----------------------------------------------------------------------------------------------
def expected_picks(workload) -> torch.Tensor:
    """The race floor's pick, with torch: k = the first j < γ whose target row maximum is below the draft row's
    (γ when none), then argmax over the vocabulary of target[k] - draft[k] (target[γ] alone at k = γ), in float32."""
    target, draft = workload.target_logits.float(), workload.draft_logits.float()
    gamma = draft.shape[1]
    rejected = target[:, :gamma].amax(dim=2) < draft.amax(dim=2)  # [B, γ]
    k = torch.where(rejected.any(dim=1), rejected.int().argmax(dim=1), torch.full_like(rejected[:, 0], gamma,
                                                                                        dtype=torch.int64))
    rows = torch.arange(target.shape[0], device=target.device)
    t_k = target[rows, k]
    d_k = torch.where((k < gamma)[:, None], draft[rows, k.clamp(max=gamma - 1)], torch.zeros_like(t_k))
    return (t_k - d_k).argmax(dim=1)


def logits_floor_runs(lib: ctypes.CDLL, workload) -> dict[str, callable]:
    """rows_max[u] (pass 1 alone) and two_pass[u,v] (rows_max, then the race under programmatic dependent launch)
    at workload; each two-pass shape's picks checked against torch."""
    target, draft = workload.target_logits, workload.draft_logits
    batch, gamma, vocab = draft.shape
    if gamma > 32:
        raise SdbenchError(f"the race floor takes γ <= 32, got {gamma}")
    bf16 = target.dtype == torch.bfloat16
    row_bytes = vocab * target.element_size()
    if row_bytes % UNIT:
        raise SdbenchError(f"logits rows of {row_bytes} bytes are not whole 16-byte units")
    row_units = row_bytes // UNIT
    rows = batch * (2 * gamma + 1)
    want = expected_picks(workload)
    runs = {}
    for rows_units, race_units in LOGITS_SHAPES:
        splits = math.ceil(row_units / (256 * rows_units))
        partials = torch.empty((rows, splits), dtype=torch.float32, device=target.device)
        picks = torch.empty((batch,), dtype=torch.int64, device=target.device)

        def two_pass(partials=partials, picks=picks, rows_units=rows_units, race_units=race_units, race=True):
            _checked(lib.chain_floor_two_pass(target.data_ptr(), draft.data_ptr(), partials.data_ptr(),
                                              picks.data_ptr(), batch, gamma, row_units, int(bf16), rows_units,
                                              race_units, int(race), _stream()), "two_pass")
        picks.fill_(-1)
        two_pass()
        torch.cuda.synchronize()
        index = (~picks) & 0xFFFFFFFF  # the key's low word holds ~index
        if not torch.equal(index, want):
            raise SdbenchError(f"two_pass[{rows_units},{race_units}] picked other tokens than torch")
        runs[f"two_pass[{rows_units},{race_units}]"] = two_pass
        if race_units == LOGITS_SHAPES[0][1]:
            runs[f"rows_max[{rows_units}]"] = lambda two_pass=two_pass: two_pass(race=False)
    return runs


def logits_bar_us(cfg: LogitsConfig, ceiling_tbps: float) -> tuple[float, float]:
    """(#18's logits read floor, its bar), µs."""
    floor = logits_read_floor_bytes(cfg) / (ceiling_tbps * 1e12) * 1e6
    return floor, LOGITS_BAR_SCALE * floor + LOGITS_BAR_US


# --- the command --------------------------------------------------------------------------------------
def parse_kv(text: str) -> list[VerifyConfig]:
    points = []
    for item in filter(None, text.split(",")):
        batch, gamma, alpha, kv_dim = item.split(":")
        points.append(VerifyConfig(batch_size=int(batch), gamma=int(gamma), alpha=float(alpha), kv_dim=int(kv_dim)))
    return points


def parse_logits(text: str) -> list[LogitsConfig]:
    dtypes = {"bf16": "bfloat16", "fp32": "float32"}
    points = []
    for item in filter(None, text.split(",")):
        batch, gamma, vocab, dtype = item.split(":")
        if dtype not in dtypes:
            raise SdbenchError(f"a logits point's dtype is bf16 or fp32, got {dtype!r}")
        points.append(LogitsConfig(batch_size=int(batch), gamma=int(gamma), vocab_size=int(vocab),
                                   logits_dtype=dtypes[dtype]))
    return points


def best_of(medians: dict[str, float], prefix: str) -> tuple[str, float] | None:
    """The fastest launch shape of one floor kernel: (name, µs)."""
    shapes = [(name, value) for name, value in medians.items() if name.startswith(prefix + "[")]
    return min(shapes, key=lambda item: item[1]) if shapes else None


def time_runs(runs: dict, l2: str, iters: int) -> dict[str, float]:
    options = timing.TimingOptions(warmup=5, iters=iters, gpu_iters=iters, cold_l2=l2 == "cold", views=("gpu",))
    result = timing.measure(runs, "cuda", options)
    return {name: views["gpu"].stats.median_us for name, views in result.items() if views["gpu"].stats is not None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kv", default="", help="batch:γ:α:kv_dim,...")
    parser.add_argument("--logits", default="", help="batch:γ:V:bf16|fp32,...")
    parser.add_argument("--l2", default="cold,warm")
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--kv-ceiling-gbps", type=float, default=None,
                        help="#17's copy ceiling (default: the profile's, as the report reads it)")
    parser.add_argument("--out", default=None, help="JSON file of the rows")
    args = parser.parse_args(argv)
    kv_points, logits_points = parse_kv(args.kv), parse_logits(args.logits)  # bad points fail before GPU work
    lib = library()
    floor = launch_floor("cuda")
    floor_runs = {} if floor.run is None else {"launch floor": floor.run}
    from sdbench.commands.logits_bench import copy_ceiling_tbps

    ceiling_tbps = copy_ceiling_tbps()
    kv_ceiling = args.kv_ceiling_gbps
    if kv_ceiling is None:
        profile = thresholds.match_profile(thresholds.load_profiles(), torch.cuda.get_device_name())
        if profile is None or not profile.copy_bandwidth_gbps:
            raise SdbenchError("no profile with a copy ceiling for this GPU: give --kv-ceiling-gbps")
        kv_ceiling = profile.copy_bandwidth_gbps
    print(f"{torch.cuda.get_device_name()}: copy ceiling {ceiling_tbps * 1000:.0f} GB/s measured (#18's floors), "
          f"{kv_ceiling:.0f} GB/s for #17's", flush=True)
    rows = []
    for cfg in kv_points:
        workload = make_workload("verify_pack", cfg, "cuda")
        expected = verify_pack(workload.draft_tokens, workload.target_tokens, workload.draft_kv)
        runs = {**kv_floor_runs(lib, workload, expected), **floor_runs}
        for name in ("fused", "ballot+pack_scan"):
            runs[name] = registry.get("verify_pack", name).prepare(workload)
        accepted_bytes = int(expected["accepted_lengths"].sum()) * cfg.kv_dim * workload.draft_kv.element_size()
        floor_us, bar = kv_bar_us(accepted_bytes, kv_ceiling)
        for l2 in args.l2.split(","):
            medians = time_runs(runs, l2, args.iters)
            row = {"issue": 17, "point": f"{cfg.batch_size}:{cfg.gamma}:{cfg.alpha:g}:{cfg.kv_dim}", "l2": l2,
                   "accepted_bytes": accepted_bytes, "floor_us": round(floor_us, 2), "bar_us": round(bar, 2),
                   "gpu_us": medians}
            rows.append(row)
            print(_line(row, ("copy", "gather", "speculative"), ("fused", "ballot+pack_scan")), flush=True)
        del workload, expected, runs
        torch.cuda.empty_cache()
    for cfg in logits_points:
        workload = make_workload("prob_verify_logits", cfg, "cuda").with_randomness("fast")
        runs = {**logits_floor_runs(lib, workload), **floor_runs,
                "fused_logits": registry.get("prob_verify_logits", "fused_logits").prepare(workload)}
        floor_us, bar = logits_bar_us(cfg, ceiling_tbps)
        dtype = "bf16" if cfg.logits_dtype == "bfloat16" else "fp32"
        for l2 in args.l2.split(","):
            medians = time_runs(runs, l2, args.iters)
            row = {"issue": 18, "point": f"{cfg.batch_size}:{cfg.gamma}:{cfg.vocab_size}:{dtype}", "l2": l2,
                   "floor_us": round(floor_us, 2), "bar_us": round(bar, 2), "gpu_us": medians}
            rows.append(row)
            print(_line(row, ("rows_max", "two_pass"), ("fused_logits",)), flush=True)
        del workload, runs
        torch.cuda.empty_cache()
    if args.out:
        Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                              "copy_ceiling_tbps": ceiling_tbps, "kv_ceiling_gbps": kv_ceiling,
                                              "rows": rows}, indent=1))
    return 0


def _line(row: dict, floors: tuple[str, ...], shipped: tuple[str, ...]) -> str:
    medians = row["gpu_us"]
    cells = []
    for prefix in floors:
        best = best_of(medians, prefix)
        if best:
            cells.append(f"{best[0]} {best[1]:.2f} ({best[1] / row['bar_us']:.2f}× bar)")
    for name in shipped:
        if name in medians:
            cells.append(f"{name} {medians[name]:.2f} ({medians[name] / row['bar_us']:.2f}× bar)")
    if "launch floor" in medians:
        cells.append(f"launch floor {medians['launch floor']:.2f}")
    return f"#{row['issue']} {row['point']} {row['l2']}: floor {row['floor_us']:.2f} bar {row['bar_us']:.2f} | " + \
        "  ".join(cells)


if __name__ == "__main__":
    raise SystemExit(main())
