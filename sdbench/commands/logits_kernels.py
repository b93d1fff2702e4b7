"""GPU time per kernel of the from-logits designs (issue #18), with fused_logits' plans as variants.

    python -m sdbench.commands.logits_kernels --points 32:8:128256:bf16,512:4:32000:fp32 \
        --variants default,noscan,scan,vllm --out kernels.json

A point is batch:γ:V:dtype (bf16 or fp32). A variant is `vllm` (vllm_v2_style) or fused_logits with
'+'-joined changes to its default plans: `scan-kernel` / `scan-race` / `scan-early` / `scan-pass1` (where the
token rule's accept scan runs; early: in the race, each program starting once its own sequence's pass 1 is
done), `span<N>` (pass 1: N columns a program), `pps<N>` (pass 1: about N programs per SM, spans rounded up),
`tile<N>` / `warps<N>` (pass 1: N columns a step, N warps a program; planned for STATS_WAVES
waves of STATS_PER_SM_GUESS programs per SM unless span or pps is named), `cap<N>` (pass 1: at most N splits
below one wave),
`r<ROWS>x<N>` (race: 4·ROWS columns a step, at most one wave of N programs per SM),
`race` / `cdf` / `picks` (how fast mode draws the residual token: the exponential race, by inversion, or by
inversion with each race program's candidate in its chunks), `combine` /
`nocombine` (pass 1 combines each row's partials, or every race program does; nocombine scans in the race
unless a scan is named), `pdl` / `nopdl` (the scan kernel and the race launched with programmatic dependent
launch, or not), `tokens-first` / `tokens-last` (a race that scans loads the draft tokens' logits before or after
the rows' stats), `lean` / `nolean` (the accept scan combines only the rows it reads, or all 2γ+1 then picks),
`words` / `nowords` (pass 1 reads bf16 rows as 32-bit words, or as elements), `readfirst` / `roworder` (pass 1's
reading programs launch before the ones greedy requests' draft rows leave empty, or in row order),
`one` (pass 1 and the race in one launch, `_one_launch_kernel`; with `span<N>`, `pps<N>`, `r<ROWS>x<N>`,
`lag<N>`: N sequences between a sequence's pass 1 and its race, B at most, and `reg<N>`: at most N registers a
thread); `default` changes nothing.
Each (point, variant, L2) prints one line: the median call's device time (`total`: the time its kernels cover,
overlaps counted once) and the kernels' CUPTI durations, each the median over the timed calls times its launches
per call, fast randomness. Each (point, L2) first prints the launch floor of the same run: an empty Triton kernel
through the designs' launch path (`launch_floor.path_floor("triton_bound")`, logits_bench's floor), timed the same
way; every row carries it as `launch_floor`. The rows are written as JSON (--out).

--timeline: for each fused_logits variant, also a timeline build (`triton_kernels._mark`: the global timer at
marks in every program of pass 1 and the race, a diagnostic build with its own registers, never the timed
design; without programmatic dependent launch unless the variant names `pdl`, whose race would enter inside pass
1 and wait there), run --iters times; a line per (point, variant, L2) of µs medians over the calls: pass 1's span (first
entry to last partial), when half and 90% of its programs were done, the gap to the race's first entry, and the
race's phases (the median program's: entry to row k's normalisers, its chunks, its arrival; the last arrival's
draw and the race's span, first entry to last outputs' values), and where pass 1's tail comes from (`pass1_tail`:
when the first SM was done, programs an SM ran, and when half the target-row, draft-row and last-split programs were).
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics

import torch
import triton

from sdbench.measure.environment import software
from sdbench.measure.timing import busy_us, l2_flush
from sdbench.ops.prob_verify_logits import triton_kernels as tk
from sdbench.ops.prob_verify_logits.common import allocate_outputs
from sdbench.ops.prob_verify_logits.workload import LogitsConfig, logits_read_floor_bytes, make_logits_workload

DTYPES = {"bf16": "bfloat16", "fp32": "float32"}


def _inputs(w) -> tk.LogitsTensors:
    return tk.LogitsTensors(w.draft_tokens, w.target_logits, w.draft_logits, w.target_temperature,
                            w.draft_temperature, w.uniforms, w.exponential_noise)


def plan_changes(variant: str, batch: int, gamma: int, vocab: int, sms: int, element_size: int = 4) -> dict:
    """fused_logits_launcher keyword arguments for a variant's '+'-joined changes (element_size: the logits')."""
    changes: dict = {}
    rows = batch * (2 * gamma + 1)
    parts = variant.split("+")
    # pass 1's step (tile<N> columns, warps<N>) and split cap (cap<N>) first: span<N> and pps<N> plan in whole
    # steps, the launcher's own step where none is named
    step = next((int(part[4:]) for part in parts if part.startswith("tile")), None)
    warps = next((int(part[5:]) for part in parts if part.startswith("warps")), None)
    cap = next((int(part[3:]) for part in parts if part.startswith("cap")), tk.STATS_SPLITS_BELOW_WAVE)
    tile = step or tk.stats_tile(element_size)
    if step is not None or warps is not None:
        # (planned for STATS_PER_SM_GUESS resident programs per SM: the launcher's re-plan with the compiled
        # kernel's count needs no plan given, and a variant's step compiles to other counts)
        plan = tk.pass_one_plan(rows, vocab, tile, tk.STATS_PER_SM_GUESS * sms, cap)
        changes["stats_plan_"] = tk.StatsPlan(plan.span, plan.splits, step, warps)
    elif cap != tk.STATS_SPLITS_BELOW_WAVE:
        changes["stats_max_splits"] = cap
    for part in parts:
        if part in ("default", "") or part.startswith(("tile", "warps", "cap")):
            continue
        if part.startswith("scan-") and part[5:] in ("kernel", "race", "early", "pass1"):
            changes["scan"] = part[5:]
        elif part in ("race", "cdf", "picks"):
            changes["sample"] = part
        elif part in ("combine", "nocombine"):
            changes["combine"] = part == "combine"
        elif part in ("pdl", "nopdl"):
            changes["pdl"] = part == "pdl"
        elif part in ("tokens-first", "tokens-last"):
            changes["tokens_first"] = part == "tokens-first"
        elif part in ("lean", "nolean"):
            changes["lean_scan"] = part == "lean"
        elif part == "one":
            changes["single"] = True
        elif part in ("words", "nowords"):
            changes["bf16_words"] = part == "words"
        elif part in ("readfirst", "roworder"):
            changes["read_first"] = part == "readfirst"
        elif part.startswith("reg"):
            changes["maxnreg"] = int(part[3:])
        elif part.startswith("lag"):
            changes["lag"] = min(int(part[3:]), batch)  # (lag<N> beyond B: every race after all of pass 1)
        elif part.startswith("span"):
            span = max(tile, int(part[4:]) // tile * tile)
            changes["stats_plan_"] = tk.StatsPlan(span, triton.cdiv(vocab, span), step, warps)
            changes.pop("stats_max_splits", None)  # (an explicit span: no cap to apply)
        elif part.startswith("pps"):
            plan = tk.stats_plan(rows, vocab, int(part[3:]) * sms, tile, max_splits=cap)
            changes["stats_plan_"] = tk.StatsPlan(plan.span, plan.splits, step, warps)
            changes.pop("stats_max_splits", None)
        elif part.startswith("r"):
            race_rows, per_sm = (int(x) for x in part[1:].split("x"))
            chunks = triton.cdiv(vocab, 4 * race_rows)
            steps = tk.race_steps(batch, chunks, per_sm * sms)
            changes["race_plan"] = tk.RacePlan(rows=race_rows, steps=steps, programs=triton.cdiv(chunks, steps),
                                               num_warps=max(1, min(4, race_rows // 32)))
        else:
            raise ValueError(f"unknown variant part {part!r}")
    if changes.get("combine") is False:
        changes.setdefault("scan", "race")  # whatever order the parts came in
    return changes


def per_kernel_us(run, iters: int, flush=None) -> tuple[dict[str, float], float]:
    """({kernel: median duration × launches per call}, the median call's device time), µs, over `iters` calls
    (each after `flush` if given). A call's device time is the time its kernels cover (`busy_us`): with
    programmatic dependent launch a kernel starts inside the one before it, and the durations overlap."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            if flush is not None:
                flush()
            run()
        torch.cuda.synchronize()
    durations = collections.defaultdict(list)
    spans = []
    for event in prof.profiler.kineto_results.events():
        name = event.name()
        # the L2 flush is torch's (a reduction or a fill); every design's kernels are Triton kernels named _*_kernel
        if event.device_type() != torch.autograd.DeviceType.CPU and name.startswith("_"):
            durations[name.removesuffix("_kernel")].append(event.duration_ns() / 1000.0)
            spans.append((event.start_ns(), event.start_ns() + event.duration_ns()))
    calls = sorted(per_call_busy_us(spans, iters))
    return {name: sorted(ts)[len(ts) // 2] * len(ts) / iters for name, ts in durations.items()}, calls[len(calls) // 2]


def launch_floor_us(floor, iters: int, flush=None) -> float | None:
    """The median call's device time of an empty launch (`launch_floor.path_floor`'s LaunchFloor), timed as
    `per_kernel_us` times a variant (each call after `flush` if given); None where none can launch (floor.reason)."""
    if floor.run is None:
        return None
    return per_kernel_us(floor.run, iters, flush)[1]


def per_call_busy_us(spans: list[tuple[int, int]], calls: int) -> list[float]:
    """Each call's device time (`busy_us`) from the (start, end) ns of every kernel of `calls` calls made one after
    another. A call's kernels may overlap each other (programmatic dependent launch), never the next call's, whose
    first kernel is a plain launch: sorted by start, each call is a run of len(spans) / calls. A record CUPTI lost
    would shift every later call's run, so a count that does not divide is an error, not a number."""
    if not spans or len(spans) % calls:
        raise RuntimeError(f"{len(spans)} kernel records for {calls} calls: CUPTI lost or added some")
    spans = sorted(spans)
    per_call = len(spans) // calls
    return [busy_us(spans[i * per_call:(i + 1) * per_call]) for i in range(calls)]


def timeline_phases(pass1: torch.Tensor, race: torch.Tensor, read: torch.Tensor | None = None,
                    gamma: int | None = None, splits: int | None = None) -> dict[str, float]:
    """One call's marks (`fused_logits_launcher(timeline=True)`'s `launch.timeline`, on the host) as µs phases.
    read (bool, one a pass-1 program, `pass1_reads`): pass 1's phases over the programs that read their span only (a
    greedy target's draft-row programs read nothing and finish at once). With gamma and splits, also where pass 1's
    tail comes from (`pass1_tail`)."""
    marks = pass1.view(-1, tk.PASS1_MARKS.value)
    p = marks.double() / 1000.0
    if read is not None:
        p = p[read]
    r = race.view(-1, tk.RACE_MARKS.value).double() / 1000.0
    start = p[:, 0].min()
    done = (p[:, 1] - start).sort().values
    race_start = r[:, 0].min()
    sampled = r[:, 2] > 0  # programs that read their chunks (a greedy target's skip them)
    last = r[:, 6] > 0
    phases = dict(
        pass1_span=float(done[-1]), pass1_half=float(done[len(done) // 2]),
        pass1_p90=float(done[int(0.9 * (len(done) - 1))]),
        pass1_entry_spread=float(p[:, 0].max() - start), gap=float(race_start - (p[:, 1].max())),
        race_entry_spread=float(r[:, 0].max() - race_start),
        to_stop=float((r[:, 1] - r[:, 0]).median()),
        chunks=float((r[sampled, 2] - r[sampled, 1]).median()) if sampled.any() else 0.0,
        arrival=float((r[sampled, 3] - r[sampled, 2]).median()) if sampled.any() else 0.0,
        last_draw=float((r[last, 4] - r[last, 3]).median()),
        last_arrival=float((r[last, 3] - race_start).median()),
        race_span=float(r[last, 4].max() - race_start),
    )
    if gamma is not None and splits is not None:
        phases.update(pass1_tail(marks, gamma, splits, read))
    return phases


def pass1_tail(marks: torch.Tensor, gamma: int, splits: int, read: torch.Tensor | None = None) -> dict[str, float]:
    """Where pass 1's tail comes from, from one call's marks [programs, PASS1_MARKS] (entry ns, partial ns, SM), in
    program order (row-major, then split; a row r <= gamma of a sequence is a target row), over the programs that
    read (`read`). µs after the first entry, like `timeline_phases`' pass-1 columns:
    - sm_done_first: when the first SM had finished all its programs (the last SM's is pass1_span). Near pass1_span,
      the SMs end together and the tail is inside each SM; well below it, some SMs held more or slower work.
    - sm_programs_min / sm_programs_max: how many programs an SM ran.
    - target_half / draft_half: when half the target-row / draft-row programs were done (nan where none read).
    - last_split_half: when half the programs of each row's last split (the short one where V is not a multiple of
      the span) were done."""
    index = torch.arange(marks.shape[0])
    target = (index // splits) % (2 * gamma + 1) <= gamma
    last_split = index % splits == splits - 1
    if read is not None:
        marks, target, last_split = marks[read], target[read], last_split[read]
    done = (marks[:, 1] - marks[:, 0].min()).double() / 1000.0
    sm = marks[:, 2]
    sm_done = [float(done[sm == s].max()) for s in sm.unique()]
    counts = torch.bincount(sm - sm.min())
    counts = counts[counts > 0]

    def half(chosen: torch.Tensor) -> float:
        return float(done[chosen].sort().values[int(chosen.sum()) // 2]) if chosen.any() else float("nan")

    return dict(sm_done_first=min(sm_done), sm_programs_min=float(counts.min()), sm_programs_max=float(counts.max()),
                target_half=half(target), draft_half=half(~target), last_split_half=half(last_split))


def pass1_reads(target_temperature: torch.Tensor, gamma: int, splits: int) -> torch.Tensor:
    """bool [B·(2γ+1)·splits] on the host, in the timeline's program order (row-major, then split): whether pass 1's
    program reads its span (the token rule skips a greedy target's γ draft rows)."""
    greedy = (target_temperature == 0).cpu()
    rows = torch.ones(greedy.numel(), 2 * gamma + 1, dtype=torch.bool)
    rows[greedy, gamma + 1:] = False
    return rows.flatten().repeat_interleave(splits)


def timeline_us(run, iters: int, flush=None, read: torch.Tensor | None = None, gamma: int | None = None,
                splits: int | None = None) -> dict[str, float]:
    """Medians over `iters` calls of `timeline_phases` (each call after `flush` if given; read: `pass1_reads`; gamma
    and splits: with `pass1_tail`'s columns)."""
    calls = []
    for i in range(iters + 2):
        for marks in run.timeline:
            marks.zero_()
        if flush is not None:
            flush()
        run()
        torch.cuda.synchronize()
        if i >= 2:  # two warm-up calls
            calls.append(timeline_phases(*(marks.cpu() for marks in run.timeline), read=read, gamma=gamma,
                                         splits=splits))
    return {key: statistics.median_high([call[key] for call in calls]) for key in calls[0]}


def _launches(variant: str, w, batch: int, gamma: int, vocab: int, sms: int, timeline: bool):
    """(the variant's launch, its timeline build or None) on workload w (fast randomness)."""
    if variant == "vllm":
        return tk.vllm_v2_style_launcher(_inputs(w), allocate_outputs(w, error_flags=False), True, w.seed, 0), None
    changes = plan_changes(variant, batch, gamma, vocab, sms, w.target_logits.element_size())
    shipped = tk.fused_logits_launcher(_inputs(w), allocate_outputs(w), True, w.seed, 0, **changes)
    if not timeline or changes.get("single"):
        return shipped, None
    # the shipped launch's plans and choices: the timeline build's registers must not re-plan it
    same = {k: v for k, v in changes.items() if k != "stats_max_splits"}  # (its plan holds it)
    # without PDL unless the variant names it: with it, the race's entry falls inside pass 1 and its first phase
    # holds the wait, so the gap and the race's phases would not mean what the timeline's columns say. (So under
    # scan "early", the default where the race fills the machine up to b = 128, the timeline shows the race after
    # all of pass 1: not the overlap the timed design has.)
    same.setdefault("pdl", False)
    same.update(stats_plan_=shipped.plans[0], race_plan=shipped.plans[1], scan=shipped.scan, combine=shipped.combine)
    return shipped, tk.fused_logits_launcher(_inputs(w), allocate_outputs(w), True, w.seed, 0, **same, timeline=True)


def launch_plans(run, element_size: int) -> tuple[dict | None, dict | None]:
    """A fused_logits launch's pass-1 and race plans as a row records them (the programs an SM holds, as compiled,
    with pass 1's), or (None, None) for a launch that has none (the peer's)."""
    plans = getattr(run, "plans", None)
    if plans is None:
        return None, None
    stats, race = plans
    per_sm = getattr(run, "programs_per_sm", None) or (None, None)  # (pass 1, race), as compiled
    return (dict(span=stats.span, splits=stats.splits, tile=stats.tile or tk.stats_tile(element_size),
                 num_warps=stats.num_warps or tk.STATS_WARPS, per_sm=per_sm[0], race_per_sm=per_sm[1]),
            dict(rows=race.rows, steps=race.steps, programs=race.programs, num_warps=race.num_warps))


def launch_choices(run) -> dict | None:
    """What a fused_logits launch resolved (where the scan runs, who combines, PDL, the race's load order, pass 1's
    program order, how the residual token is drawn), so a row says what its variant ran whatever the defaults were
    then; None for a launch that has none."""
    names = ("scan", "combine", "pdl", "tokens_first", "lean_scan", "read_first", "sample")
    return {name: getattr(run, name) for name in names if hasattr(run, name)} or None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", required=True, help="batch:γ:V:dtype,... (dtype bf16 or fp32)")
    parser.add_argument("--variants", default="default,vllm")
    parser.add_argument("--l2", default="cold,warm", help="cold (the L2 flushed clean), dirty (flushed by a "
                        "write: the timed call pays the write-back), warm")
    parser.add_argument("--iters", type=int, default=15)
    parser.add_argument("--out", default=None, help="JSON file of the rows")
    parser.add_argument("--timeline", action="store_true", help="also each fused_logits variant's timeline build")
    parser.add_argument("--graph", action="store_true", help="also the graph view of every variant, timed together "
                        "(sdbench.measure.timing: copies of a call per CUDA-graph replay; what an engine in a graph "
                        "pays)")
    parser.add_argument("--copy-tbps", type=float, default=None,
                        help="the copy ceiling the floors are read at (default: a 1 GiB copy measured now, as "
                        "logits_bench)")
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    flushes = {"cold": l2_flush(device), "dirty": l2_flush(device, dirty=True), "warm": None}
    if args.copy_tbps is None:
        from sdbench.commands.logits_bench import copy_ceiling_tbps

        args.copy_tbps = copy_ceiling_tbps()
    git_sha = software()["git_sha"]  # the code a row timed (a variant named `default` means that code's defaults)
    from sdbench.ops.launch_floor import path_floor

    floor_launch = path_floor("triton_bound", device)
    if floor_launch.run is None:
        print(f"no launch floor: {floor_launch.reason}", flush=True)
    rows = []
    for point in args.points.split(","):
        batch, gamma, vocab, dtype = point.split(":")
        batch, gamma, vocab = int(batch), int(gamma), int(vocab)
        cfg = LogitsConfig(batch_size=batch, gamma=gamma, vocab_size=vocab, logits_dtype=DTYPES[dtype])
        w = make_logits_workload(cfg, device).with_randomness("fast")
        floor_us = logits_read_floor_bytes(cfg) / (args.copy_tbps * 1e12) * 1e6
        calls, timelines = {}, {}
        for variant in args.variants.split(","):
            try:
                launches = _launches(variant, w, batch, gamma, vocab, sms, args.timeline)
            except ValueError as err:  # a variant that does not apply (one+scan-kernel: one launch scans in its race)
                print(f"{batch:4d} {gamma:2d} {vocab:6d} {dtype} {variant}: not run: {err}", flush=True)
                continue
            calls[variant] = launches[0]
            if launches[1] is not None:
                timelines[variant] = launches[1]
        for l2 in args.l2.split(","):
            launch_floor = launch_floor_us(floor_launch, args.iters, flushes[l2])
            if launch_floor is not None:
                print(f"{batch:4d} {gamma:2d} {vocab:6d} {dtype} {l2} launch floor {launch_floor:.2f}", flush=True)
            for variant, run in calls.items():
                kernels, total = per_kernel_us(run, args.iters, flushes[l2])
                plan, race_plan = launch_plans(run, w.target_logits.element_size())
                rows.append(dict(b=batch, g=gamma, v=vocab, d=dtype, cold=l2 != "warm", l2=l2, var=variant, total=total,
                                 floor=floor_us, copy_tbps=args.copy_tbps, kernels=kernels, pass1_plan=plan,
                                 race_plan=race_plan, choices=launch_choices(run), git_sha=git_sha,
                                 launch_floor=launch_floor))
                print(f"{batch:4d} {gamma:2d} {vocab:6d} {dtype} {l2} floor {floor_us:7.1f} {variant:12s} "
                      f"total {total:8.1f} | " + " ".join(f"{n}={t:.1f}" for n, t in kernels.items())
                      + (f" | splits {plan['splits']}" if plan else ""), flush=True)
                if variant in timelines:
                    splits = timelines[variant].plans[0].splits
                    read = pass1_reads(w.target_temperature, gamma, splits)
                    phases = timeline_us(timelines[variant], args.iters, flushes[l2], read, gamma, splits)
                    rows.append(dict(b=batch, g=gamma, v=vocab, d=dtype, cold=l2 != "warm", l2=l2, var=variant,
                                     timeline=phases))
                    print(f"{'':4s} timeline {variant}: " + " ".join(f"{k}={v:.2f}" for k, v in phases.items()),
                          flush=True)
        if args.graph:
            from sdbench.measure.timing import TimingOptions, measure

            for l2 in args.l2.split(","):
                if l2 == "dirty":
                    continue
                options = TimingOptions(warmup=5, iters=30, cold_l2=l2 == "cold", views=("graph",))
                timed = measure(calls, device, options)
                for variant, views in timed.items():
                    stats = views["graph"].stats
                    median = None if stats is None else stats.median_us
                    rows.append(dict(b=batch, g=gamma, v=vocab, d=dtype, cold=l2 != "warm", l2=l2, var=variant,
                                     graph=median, floor=floor_us, reason=views["graph"].reason,
                                     choices=launch_choices(calls[variant]), git_sha=git_sha))
                    shown = "—" if median is None else f"{median:8.1f}"
                    print(f"{batch:4d} {gamma:2d} {vocab:6d} {dtype} {l2} floor {floor_us:7.1f} {variant:12s} "
                          f"graph {shown}", flush=True)
        del calls, timelines, w
        torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
