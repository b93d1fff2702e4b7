"""Chain floors: what kernels that do strictly less than a correct kernel of a design class take at a point of
issue #17's or #18's grid (csrc/tools/chain_floor.cu says what each leaves out), beside the shipped kernel and the
launch floor in the same rotation. A floor is empirical: the fastest of the launch shapes tried, for kernels of
these shapes.

    python -m sdbench.commands.chain_floor --kv 16384:4:0.3:128,1024:128:0.3:64 \
        --logits 32:4:32000:bf16,128:4:32000:bf16 --out floors.json

A --kv point is batch:γ:α:kv_dim (fp16 KV, int64 tokens, binomial lengths: the scale-kv grid's workload; γ and the
row's 16-byte units powers of two); a --logits point is batch:γ:V:bf16|fp32 (the logits grid's workload, mixed
temperatures; γ <= 32). Each floor kernel is checked against the reference (KV: the packed rows, and nothing
written past them; logits: the pick, recomputed with torch) before it is timed, and its time is the best over its
launch shapes (units a thread). Where a logits batch's greedy requests fall every P-th (the grid's temperature
cycle), the two-pass floors are timed twice: reading every row, and reading what fused_logits reads (`sampled_`: no
draft row of a greedy request, no race for it). The bars are the issues': #17 1.3 × (2 × accepted bytes / copy ceiling) + 2 µs
cold (the report's), #18 1.3 × (logits bytes / copy ceiling) + 3 µs (logits_summary's). Times: CUPTI GPU time,
the median over --iters calls, per L2 state; the rows are written to --out after every point.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
from collections.abc import Callable
from pathlib import Path

import torch

from sdbench import ext, registry, thresholds
from sdbench.commands.logits_bench import copy_ceiling_tbps
from sdbench.commands.logits_summary import bar_us as logits_bar
from sdbench.commands.report import KV_FLOOR_BAR_SCALE, KV_FLOOR_BAR_US
from sdbench.errors import SdbenchError
from sdbench.measure import timing
from sdbench.ops import make_workload
from sdbench.ops.launch_floor import launch_floor
from sdbench.ops.prob_verify_logits.workload import LogitsConfig, LogitsWorkload, logits_read_floor_bytes
from sdbench.ops.verify_pack.reference import verify_pack
from sdbench.ops.workload import VerifyConfig, VerifyWorkload

SOURCE = ext.CSRC_DIR / "tools" / "chain_floor.cu"
THREADS = 256  # chain_floor.cu kThreads
UNIT = 16  # bytes a thread moves per load
KV_BYTES = 2  # the scale-kv workload's fp16 KV
KV_SHAPES = (1, 2, 4)  # units a thread for gather and speculative; copy also 8
LOGITS_SHAPES = ((4, 2), (4, 4), (8, 2), (8, 4))  # (rows_max, race) units a thread
MAX_GRID_Y = 65535  # rows_max's grid is (splits, rows)
L2_STATES = ("cold", "warm")


def library() -> ctypes.CDLL:
    """csrc/tools/chain_floor.cu, built by ext.tool_library, with its entry points typed."""
    lib = ctypes.CDLL(str(ext.tool_library(SOURCE)))
    pointer, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.chain_floor_copy.argtypes = [pointer, pointer, i64, i32, pointer]
    lib.chain_floor_gather.argtypes = [pointer, pointer, pointer, i64, i32, i32, i32, i32, pointer]
    lib.chain_floor_two_pass.argtypes = [pointer, pointer, pointer, pointer, i32, i32, i32, i32, i32, i32, i32,
                                         i32, pointer]
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
def kv_shifts(gamma: int, kv_dim: int) -> tuple[int, int]:
    """(log2 of a row's 16-byte units, log2 of a sequence's), for fp16 rows of kv_dim."""
    row_bytes = kv_dim * KV_BYTES
    if row_bytes % UNIT:
        raise SdbenchError(f"rows of {row_bytes} bytes are not whole 16-byte units")
    log_row = log2_exact(row_bytes // UNIT, "a row's 16-byte units")
    return log_row, log_row + log2_exact(gamma, "γ")


def kv_floor_runs(lib: ctypes.CDLL, workload: VerifyWorkload,
                  expected: dict[str, torch.Tensor]) -> dict[str, Callable[[], None]]:
    """copy[u], gather[u] and speculative[u] at workload, each checked against the reference's packed rows (and
    for writing nothing past them)."""
    draft_kv = workload.draft_kv
    batch, gamma, kv_dim = draft_kv.shape
    log_row, log_slab = kv_shifts(gamma, kv_dim)
    total_rows = int(expected["accepted_lengths"].sum())
    want = expected["packed_kv"][:total_rows]
    accepted = want.clone()  # the copy's source: the accepted bytes as one run
    length_offset = torch.stack([expected["accepted_lengths"], expected["packed_offsets"]], dim=1).contiguous()
    drafted_units = draft_kv.numel() * draft_kv.element_size() // UNIT
    accepted_units = want.numel() * want.element_size() // UNIT
    runs = {}

    def checked_run(name: str, launch: Callable[[], None], out: torch.Tensor) -> None:
        out.fill_(-1)  # poison: a row it does not write, or one it writes past the packed rows, fails the check
        launch()
        torch.cuda.synchronize()
        if not torch.equal(out[:total_rows], want) or not bool((out[total_rows:] == -1).all()):
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
    """(#17's copy floor, its bar), µs, as the report's roofline table computes them."""
    floor = 2 * accepted_bytes / ceiling_gbps / 1e3
    return floor, KV_FLOOR_BAR_SCALE * floor + KV_FLOOR_BAR_US


# --- #18 ----------------------------------------------------------------------------------------------
def expected_picks(workload: LogitsWorkload) -> torch.Tensor:
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


def logits_row_units(cfg: LogitsConfig) -> int:
    """A logits row's 16-byte units, after the checks the floor kernels need (γ <= 32, rows of whole units, a grid
    of at most MAX_GRID_Y rows)."""
    if cfg.gamma > 32:
        raise SdbenchError(f"the race floor takes γ <= 32, got {cfg.gamma}")
    row_bytes = cfg.vocab_size * cfg.element_bytes
    if row_bytes % UNIT:
        raise SdbenchError(f"logits rows of {row_bytes} bytes are not whole 16-byte units")
    if cfg.batch_size * (2 * cfg.gamma + 1) > MAX_GRID_Y:
        raise SdbenchError(f"rows_max launches one block row per logits row: at most {MAX_GRID_Y} rows")
    return row_bytes // UNIT


def greedy_period(workload: LogitsWorkload) -> int:
    """P where request s is greedy (target temperature 0) exactly when s % P == 0, as a temperature cycle of length
    P starting at 0 makes them (the grid's); 0 where no request is greedy, they fall otherwise, or the rule is not
    the token rule (under the block rule fused_logits reads a greedy request's draft rows too)."""
    greedy = workload.target_temperature == 0
    if workload.config.rule != "token" or not bool(greedy.any()):
        return 0
    period = len(workload.config.temperatures)
    pattern = torch.arange(greedy.shape[0], device=greedy.device) % period == 0
    return period if period >= 2 and torch.equal(greedy, pattern) else 0


def two_pass_runs(lib: ctypes.CDLL, workload: LogitsWorkload, period: int = 0) -> dict[str, Callable[[], None]]:
    """rows_max[u] (pass 1 alone) and two_pass[u,v] (rows_max, then the race under programmatic dependent launch)
    at workload, each two-pass shape's picks checked against torch. period P > 0: the `sampled_` floors, which read
    no draft row of a greedy request (s % P == 0) and race sampled requests only; their picks are checked there."""
    target, draft = workload.target_logits, workload.draft_logits
    batch, gamma, _ = draft.shape
    row_units = logits_row_units(workload.config)
    bf16 = target.dtype == torch.bfloat16
    rows = batch * (2 * gamma + 1)
    requests = torch.arange(batch, device=target.device)
    raced = requests % period != 0 if period else torch.ones_like(requests, dtype=torch.bool)
    want = expected_picks(workload)[raced]
    prefix = "sampled_" if period else ""
    runs = {}
    for rows_units, race_units in LOGITS_SHAPES:
        splits = math.ceil(row_units / (THREADS * rows_units))
        partials = torch.empty((rows, splits), dtype=torch.float32, device=target.device)
        picks = torch.empty((batch,), dtype=torch.int64, device=target.device)

        def two_pass(partials=partials, picks=picks, rows_units=rows_units, race_units=race_units, race=True):
            _checked(lib.chain_floor_two_pass(target.data_ptr(), draft.data_ptr(), partials.data_ptr(),
                                              picks.data_ptr(), batch, gamma, row_units, int(bf16), rows_units,
                                              race_units, int(race), period, _stream()), "two_pass")
        two_pass()
        torch.cuda.synchronize()
        index = (~picks[raced]) & 0xFFFFFFFF  # the key's low word holds ~index
        if not torch.equal(index, want):
            raise SdbenchError(f"{prefix}two_pass[{rows_units},{race_units}] picked other tokens than torch")
        if not bool((picks[~raced] == 0).all()):  # rows_max zeroed them; a race over a greedy request did more work
            raise SdbenchError(f"{prefix}two_pass[{rows_units},{race_units}] raced a greedy request")
        runs[f"{prefix}two_pass[{rows_units},{race_units}]"] = two_pass
        if race_units == LOGITS_SHAPES[0][1]:
            runs[f"{prefix}rows_max[{rows_units}]"] = lambda two_pass=two_pass: two_pass(race=False)
    return runs


def logits_floor_runs(lib: ctypes.CDLL, workload: LogitsWorkload) -> dict[str, Callable[[], None]]:
    """The two-pass floors at workload: reading every row (rows_max, two_pass) and, where its greedy requests fall
    every P-th (greedy_period), reading what fused_logits reads (sampled_rows_max, sampled_two_pass)."""
    runs = two_pass_runs(lib, workload)
    period = greedy_period(workload)
    if period:
        runs.update(two_pass_runs(lib, workload, period))
    return runs


def logits_bar_us(cfg: LogitsConfig, ceiling_tbps: float) -> tuple[float, float]:
    """(#18's logits read floor, its bar), µs, as logits_summary computes them."""
    floor = logits_read_floor_bytes(cfg) / (ceiling_tbps * 1e12) * 1e6
    return floor, logits_bar(floor)


# --- the command --------------------------------------------------------------------------------------
def _fields(item: str, count: int, form: str) -> list[str]:
    fields = item.split(":")
    if len(fields) != count:
        raise SdbenchError(f"a point is {form}, got {item!r}")
    return fields


def parse_kv(text: str) -> list[VerifyConfig]:
    """--kv's points, each checked for what the floor kernels need before any GPU work."""
    points = []
    for item in filter(None, text.split(",")):
        batch, gamma, alpha, kv_dim = _fields(item, 4, "batch:γ:α:kv_dim")
        try:
            cfg = VerifyConfig(batch_size=int(batch), gamma=int(gamma), alpha=float(alpha), kv_dim=int(kv_dim))
        except ValueError as err:
            raise SdbenchError(f"bad point {item!r}: {err}") from err
        kv_shifts(cfg.gamma, cfg.kv_dim)
        points.append(cfg)
    return points


def parse_logits(text: str) -> list[LogitsConfig]:
    """--logits' points, each checked for what the floor kernels need before any GPU work."""
    dtypes = {"bf16": "bfloat16", "fp32": "float32"}
    points = []
    for item in filter(None, text.split(",")):
        batch, gamma, vocab, dtype = _fields(item, 4, "batch:γ:V:bf16|fp32")
        if dtype not in dtypes:
            raise SdbenchError(f"a logits point's dtype is bf16 or fp32, got {dtype!r}")
        try:
            cfg = LogitsConfig(batch_size=int(batch), gamma=int(gamma), vocab_size=int(vocab),
                               logits_dtype=dtypes[dtype])
        except ValueError as err:
            raise SdbenchError(f"bad point {item!r}: {err}") from err
        logits_row_units(cfg)
        points.append(cfg)
    return points


def parse_l2(text: str) -> list[str]:
    states = [state for state in text.split(",") if state]
    if not states or any(state not in L2_STATES for state in states):
        raise SdbenchError(f"--l2 is a comma list of {', '.join(L2_STATES)}, got {text!r}")
    return states


def best_of(medians: dict[str, float], prefix: str) -> tuple[str, float] | None:
    """The fastest launch shape of one floor kernel: (name, µs)."""
    shapes = [(name, value) for name, value in medians.items() if name.startswith(prefix + "[")]
    return min(shapes, key=lambda item: item[1]) if shapes else None


def time_runs(runs: dict[str, Callable[[], object]], l2: str, iters: int) -> tuple[dict[str, float], dict[str, str]]:
    """(medians, reasons): each callable's median GPU µs, or why it has none."""
    options = timing.TimingOptions(warmup=5, iters=iters, gpu_iters=iters, cold_l2=l2 == "cold", views=("gpu",))
    medians, reasons = {}, {}
    for name, views in timing.measure(runs, "cuda", options).items():
        if views["gpu"].stats is not None:
            medians[name] = views["gpu"].stats.median_us
        else:
            reasons[name] = views["gpu"].reason or views["gpu"].status
    return medians, reasons


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
    kv_points, logits_points, l2_states = parse_kv(args.kv), parse_logits(args.logits), parse_l2(args.l2)
    device_name = torch.cuda.get_device_name()
    kv_ceiling = args.kv_ceiling_gbps
    if kv_ceiling is None:
        profile = thresholds.match_profile(thresholds.load_profiles(), device_name)
        if profile is None or not profile.copy_bandwidth_gbps:
            raise SdbenchError("no profile with a copy ceiling for this GPU: give --kv-ceiling-gbps")
        kv_ceiling = profile.copy_bandwidth_gbps
    lib = library()
    floor = launch_floor("cuda")
    floor_runs = {} if floor.run is None else {"launch floor": floor.run}
    ceiling_tbps = copy_ceiling_tbps()
    print(f"{device_name}: copy ceiling {ceiling_tbps * 1000:.0f} GB/s measured (#18's floors), "
          f"{kv_ceiling:.0f} GB/s for #17's", flush=True)
    rows = []

    def record(row: dict, floors: tuple[str, ...], shipped: tuple[str, ...]) -> None:
        rows.append(row)
        print(_line(row, floors, shipped), flush=True)
        if args.out:  # after every point: a later point that fails loses nothing timed before it
            Path(args.out).write_text(json.dumps({"device": device_name, "copy_ceiling_tbps": ceiling_tbps,
                                                  "kv_ceiling_gbps": kv_ceiling, "rows": rows}, indent=1))

    for cfg in kv_points:
        workload = make_workload("verify_pack", cfg, "cuda")
        expected = verify_pack(workload.draft_tokens, workload.target_tokens, workload.draft_kv)
        runs = {**kv_floor_runs(lib, workload, expected), **floor_runs}
        for name in ("fused", "ballot+pack_scan"):
            runs[name] = registry.get("verify_pack", name).prepare(workload)
        accepted_bytes = int(expected["accepted_lengths"].sum()) * cfg.kv_dim * workload.draft_kv.element_size()
        floor_us, bar = kv_bar_us(accepted_bytes, kv_ceiling)
        for l2 in l2_states:
            medians, reasons = time_runs(runs, l2, args.iters)
            record({"issue": 17, "point": f"{cfg.batch_size}:{cfg.gamma}:{cfg.alpha:g}:{cfg.kv_dim}", "l2": l2,
                    "accepted_bytes": accepted_bytes, "floor_us": round(floor_us, 2), "bar_us": round(bar, 2),
                    "gpu_us": medians, "reasons": reasons},
                   ("copy", "gather", "speculative"), ("fused", "ballot+pack_scan"))
        del workload, expected, runs
        torch.cuda.empty_cache()
    for cfg in logits_points:
        workload = make_workload("prob_verify_logits", cfg, "cuda").with_randomness("fast")
        runs = {**logits_floor_runs(lib, workload), **floor_runs,
                "fused_logits": registry.get("prob_verify_logits", "fused_logits").prepare(workload)}
        floor_us, bar = logits_bar_us(cfg, ceiling_tbps)
        dtype = "bf16" if cfg.logits_dtype == "bfloat16" else "fp32"
        for l2 in l2_states:
            medians, reasons = time_runs(runs, l2, args.iters)
            record({"issue": 18, "point": f"{cfg.batch_size}:{cfg.gamma}:{cfg.vocab_size}:{dtype}", "l2": l2,
                    "floor_us": round(floor_us, 2), "bar_us": round(bar, 2), "gpu_us": medians, "reasons": reasons},
                   ("rows_max", "two_pass", "sampled_rows_max", "sampled_two_pass"), ("fused_logits",))
        del workload, runs
        torch.cuda.empty_cache()
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
    cells += [f"{name}: no time ({reason})" for name, reason in row["reasons"].items()]
    head = f"#{row['issue']} {row['point']} {row['l2']}: floor {row['floor_us']:.2f} bar {row['bar_us']:.2f} | "
    return head + "  ".join(cells)


if __name__ == "__main__":
    raise SystemExit(main())
