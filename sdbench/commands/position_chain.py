"""A probe for a from-logits design not built (issue #18; docs/perf-notes.md, "Session 29"): read each sequence's
rows in position order and stop at its first rejection. What it times is the chain alone, with no accept test and
no race: how long the dependent steps cost against one parallel pass over every row.

    python -m sdbench.commands.position_chain --points 32:4:32000:bf16,128:4:32000:bf16 --out chain.json

The kernel (`_position_chain_kernel`) runs (γ + 1) · B · 2 · splits programs, position-major. A program of
position j reads its split of the sequence's target row j or draft row j (there is no draft row γ) and stores the
split's (max, Σexp) partial. The position's last arrival combines both rows' partials into their stats and
publishes the sequence's frontier: "verified through j" or "stopped". Before reading, a program of position
j > 0 waits until its sequence's frontier reaches j, and exits without reading if the sequence stopped. Where a
sequence stops is given (`stop_at`, the accepted length k the reference draws for the workload, or γ), since
the probe has no accept test. A program waits only on programs of lower index, which the GPU dispatched no
earlier (the assumption the decoupled look-back of verify_pack makes), so nothing deadlocks. The interpreter runs
programs in index order, so the wait never spins there.

Modes, each a line of GPU time (CUPTI, the median call, `logits_kernels.per_kernel_us`):
- `parallel`: no waiting, every row read: what one pass over the logits costs in this kernel.
- `chain-all`: the chain with no sequence stopping: the dependent steps' cost with every row read.
- `chain-k`: the chain stopping at the reference's k: what the design would read, and the steps it takes.
- `chain-k-read-first`: the same chain, each program reading its split before it waits: every row read, but the
  reads overlap the chain, so a step costs the verdict's round trips without a DRAM read.
For comparison, fused_logits' own pass 1 (`_row_stats`) and its whole step, timed the same way.
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

from sdbench.ops.prob_verify_logits.triton_kernels import INTERPRETED, LOG2E, LOWEST, _fold_tile

STOPPED = 63  # the frontier's state once its sequence has stopped (γ < STOPPED)
FRONTIER_STATES = 64  # frontier = epoch · FRONTIER_STATES + state
# A waiting program gives up after this many polls (~1 s) and raises the abort word, which every other waiter
# reads, so a chain that cannot progress (were blocks not dispatched in index order) ends instead of hanging
MAX_POLLS = 1 << 20
TILE = 1024


@triton.jit
def _split_partial(row_ptr, split, span, vocab, TILE: tl.constexpr, VEC: tl.constexpr, FTZ_EXP2: tl.constexpr):
    """(max, Σexp relative to it) over the split's columns of one row (temperature 1), folded a tile at a time
    by pass 1's `_fold_tile`, one 16-byte load a lane, so a step reads and folds as pass 1 does."""
    lanes = tl.arange(0, TILE // VEC)
    offsets = lanes[:, None] * VEC + tl.arange(0, VEC)[None, :]
    m = tl.full([TILE // VEC], LOWEST, tl.float32)
    s = tl.zeros([TILE // VEC], tl.float32)
    arg = tl.zeros([TILE // VEC], tl.int32)  # (no greedy rows here: never read)
    start = split * span
    end = tl.minimum(start + span, vocab)
    for offset in range(0, span, TILE):
        cols = start + offset + offsets
        x = tl.load(row_ptr + cols, mask=cols < end, other=float("-inf")).to(tl.float32)
        m, s, arg = _fold_tile(x, m, s, arg, start + offset + lanes * VEC, LOG2E, False, FTZ_EXP2)
    row_m = tl.max(m, axis=0)
    total = tl.sum(s * tl.exp2((m - row_m) * LOG2E), axis=0)
    return tl.where(total > 0, row_m, float("-inf")), total


@triton.jit
def _frontier_reached(frontier_ptr, abort_ptr, epoch, j, STATES: tl.constexpr, STOP: tl.constexpr,
                      MAX_POLLS: tl.constexpr):
    """Wait until the sequence's frontier, in this epoch, is at least j or says it stopped: True to go on, False
    if it stopped before j or the chain was abandoned (this waiter or another polled MAX_POLLS times)."""
    state = tl.atomic_add(frontier_ptr, 0, sem="acquire")
    stuck = tl.load(abort_ptr, volatile=True)
    polls = 0
    while ((state // STATES != epoch) | ((state % STATES < j) & (state % STATES != STOP))) & (stuck == 0):
        state = tl.atomic_add(frontier_ptr, 0, sem="acquire")
        polls += 1
        if polls >= MAX_POLLS:
            tl.atomic_xchg(abort_ptr, 1)
            stuck = 1
        else:
            stuck = tl.load(abort_ptr, volatile=True)
    return (stuck == 0) & (state % STATES != STOP)


@triton.jit(do_not_specialize=["epoch"])
def _position_chain_kernel(
    target_ptr, draft_ptr, stop_at_ptr, partial_ptr, stats_ptr, arrivals_ptr, frontier_ptr, abort_ptr,
    batch, vocab, span, splits, epoch,
    stride_p_b, stride_p_row, stride_q_b, stride_q_row,
    GAMMA: tl.constexpr, TILE: tl.constexpr, VEC: tl.constexpr, FTZ_EXP2: tl.constexpr, WAIT: tl.constexpr,
    READ_FIRST: tl.constexpr, STATES: tl.constexpr, STOP: tl.constexpr, MAX_POLLS: tl.constexpr,
):
    """Grid ((γ+1)·B·2·splits,), position-major; see the module's docstring. partial: fp32 [B, 2γ+1, splits, 2];
    stats: fp32 [B, 2γ+1, 2] (rows ordered target 0, draft 0, target 1, …, target γ); arrivals: int32 [B, γ+1],
    zero between calls (the last arrival resets its count); frontier: int32 [B], epoch · STATES + state (STOP once
    the sequence stopped), so a new call (a new epoch) needs no reset; abort: int32 [1], raised by a waiter that
    polled MAX_POLLS times (sticky: the caller checks it). READ_FIRST: a program reads its split before it waits
    (every row read, the reads overlapping the chain), and still drops it if its sequence stopped."""
    t = tl.program_id(0)
    per_position = batch * 2 * splits
    j = t // per_position
    rest = t % per_position
    seq = rest // (2 * splits)
    is_draft = (rest // splits) % 2
    split = rest % splits
    if (j == GAMMA) & (is_draft == 1):
        return  # there is no draft row γ
    if is_draft == 1:
        row_ptr = draft_ptr + seq * stride_q_b + j * stride_q_row
    else:
        row_ptr = target_ptr + seq * stride_p_b + j * stride_p_row
    if READ_FIRST:
        row_m, row_s = _split_partial(row_ptr, split, span, vocab, TILE, VEC, FTZ_EXP2)
    if WAIT & (j > 0):
        if not _frontier_reached(frontier_ptr + seq, abort_ptr, epoch, j, STATES, STOP, MAX_POLLS):
            return  # the sequence stopped before j (its row j is not used), or the chain was abandoned
    if not READ_FIRST:
        row_m, row_s = _split_partial(row_ptr, split, span, vocab, TILE, VEC, FTZ_EXP2)
    row = 2 * j + is_draft
    slot = partial_ptr + ((seq * (2 * GAMMA + 1) + row) * splits + split) * 2
    tl.store(slot, row_m)
    tl.store(slot + 1, row_s)
    programs = tl.where(j == GAMMA, splits, 2 * splits)
    arrived = tl.atomic_add(arrivals_ptr + seq * (GAMMA + 1) + j, 1, sem="acq_rel")
    if arrived == programs - 1:  # the position's last arrival: both rows' stats, then the frontier
        tl.store(arrivals_ptr + seq * (GAMMA + 1) + j, 0)
        rows = tl.where(j == GAMMA, 1, 2)
        for r in range(0, rows):
            base = partial_ptr + ((seq * (2 * GAMMA + 1) + 2 * j + r) * splits) * 2
            parts = tl.arange(0, 1024)
            pm = tl.load(base + 2 * parts, mask=parts < splits, other=float("-inf"), volatile=True)
            ps = tl.load(base + 2 * parts + 1, mask=parts < splits, other=0.0, volatile=True)
            top = tl.max(pm, axis=0)
            total = tl.sum(ps * tl.exp(tl.where(pm == float("-inf"), float("-inf"), pm - top)), axis=0)
            out = stats_ptr + (seq * (2 * GAMMA + 1) + 2 * j + r) * 2
            tl.store(out, top)
            tl.store(out + 1, total)
        stop = tl.load(stop_at_ptr + seq)
        state = tl.where((j >= stop) | (j == GAMMA), STOP, j + 1)
        tl.atomic_xchg(frontier_ptr + seq, epoch * STATES + state, sem="release")


class PositionChain:
    """One prepared probe: `run()` launches it once (a new epoch each call)."""

    def __init__(self, target: torch.Tensor, draft: torch.Tensor, stop_at: torch.Tensor, splits: int, wait: bool,
                 read_first: bool = False):
        batch, positions, vocab = target.shape
        self.gamma = positions - 1
        if draft.shape != (batch, self.gamma, vocab):
            raise ValueError(f"draft logits must be [B, γ, V] = {(batch, self.gamma, vocab)}, got {tuple(draft.shape)}")
        if not 1 <= splits <= 1024 or self.gamma >= STOPPED:
            raise ValueError(f"splits must be in [1, 1024] and γ < {STOPPED}, got {splits} and {self.gamma}")
        if target.stride(2) != 1 or draft.stride(2) != 1 or draft.dtype != target.dtype:
            raise ValueError("logits rows must be contiguous, target and draft of one dtype")
        if stop_at.shape != (batch,) or stop_at.device != target.device:
            raise ValueError(f"stop_at must be [B] = [{batch}] on {target.device}, got {tuple(stop_at.shape)} on "
                             f"{stop_at.device}")
        self.target, self.draft, self.stop_at = target, draft, stop_at.to(torch.int32)
        self.splits, self.wait, self.read_first, self.vocab, self.batch = splits, wait, read_first, vocab, batch
        self.span = triton.cdiv(vocab, splits)
        device, rows = target.device, 2 * self.gamma + 1
        self.partial = torch.empty(batch, rows, splits, 2, dtype=torch.float32, device=device)
        self.stats = torch.full((batch, rows, 2), float("nan"), dtype=torch.float32, device=device)
        self.arrivals = torch.zeros(batch, self.gamma + 1, dtype=torch.int32, device=device)
        self.frontier = torch.zeros(batch, dtype=torch.int32, device=device)
        self.abort = torch.zeros(1, dtype=torch.int32, device=device)
        self.epoch = 0

    def run(self) -> torch.Tensor:
        # epochs wrap below 2^31 / FRONTIER_STATES; a frontier left from a call 2^25 calls ago cannot match
        self.epoch = self.epoch % (2**31 // FRONTIER_STATES - 1) + 1
        grid = ((self.gamma + 1) * self.batch * 2 * self.splits,)
        _position_chain_kernel[grid](
            self.target, self.draft, self.stop_at, self.partial, self.stats, self.arrivals, self.frontier, self.abort,
            self.batch, self.vocab, self.span, self.splits, self.epoch,
            self.target.stride(0), self.target.stride(1), self.draft.stride(0), self.draft.stride(1),
            GAMMA=self.gamma, TILE=TILE, VEC=16 // self.target.element_size(),
            FTZ_EXP2=self.target.is_cuda and not INTERPRETED, WAIT=self.wait, READ_FIRST=self.read_first,
            STATES=FRONTIER_STATES, STOP=STOPPED, MAX_POLLS=MAX_POLLS, num_warps=4)
        return self.stats


    def rows_read(self) -> torch.Tensor:
        """bool [B, 2γ+1]: the rows a call reads (target 0..k and draft 0..k, none at γ; every row without WAIT)."""
        stop = self.stop_at.long() if self.wait else torch.full_like(self.stop_at, self.gamma).long()
        rows = torch.arange(2 * self.gamma + 1, device=stop.device)
        return rows[None, :] < (2 * stop + 1 + (stop < self.gamma).long())[:, None]

    def check(self) -> str | None:
        """One call's stats against torch's (float32), outside any timing: None, or what is wrong. The chain's
        waits and memory ordering are exercised only here on a GPU (the interpreter runs programs in order)."""
        self.stats.fill_(float("nan"))
        stats = self.run().clone()
        if int(self.abort.item()):
            return "a waiter gave up: the chain did not progress"
        read = self.rows_read()
        for row in range(2 * self.gamma + 1):
            logits = (self.target[:, row // 2] if row % 2 == 0 else self.draft[:, row // 2]).float()
            top = logits.amax(-1)
            expected = torch.stack([top, torch.exp(logits - top[:, None]).sum(-1)], -1)
            got = stats[:, row]
            if not torch.allclose(got[read[:, row]], expected[read[:, row]], rtol=1e-4, atol=1e-4):
                return f"row {row}: stats differ from torch's"
            if not torch.isnan(got[~read[:, row]]).all():
                return f"row {row}: a sequence that stopped before it read it"
        return None


def default_splits(vocab: int, element_size: int) -> int:
    """A split is about 4 KiB of a row per TILE step, four steps a program (pass 1's step, session 15)."""
    return max(1, triton.cdiv(vocab * element_size, 4 * 4096))


def main(argv: list[str] | None = None) -> int:
    from sdbench.commands.logits_kernels import DTYPES, _inputs, per_kernel_us
    from sdbench.measure.timing import l2_flush
    from sdbench.ops.prob_verify_logits import triton_kernels as tk
    from sdbench.ops.prob_verify_logits.common import allocate_outputs
    from sdbench.ops.prob_verify_logits.reference import reference_outputs
    from sdbench.ops.prob_verify_logits.workload import LogitsConfig, make_logits_workload

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", required=True, help="batch:γ:V:dtype,... (dtype bf16 or fp32)")
    parser.add_argument("--l2", default="cold,warm")
    parser.add_argument("--iters", type=int, default=15)
    parser.add_argument("--out", default=None, help="JSON file of the rows")
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    flushes = {"cold": l2_flush(device), "warm": None}
    rows = []
    for point in args.points.split(","):
        batch, gamma, vocab, dtype = point.split(":")
        batch, gamma, vocab = int(batch), int(gamma), int(vocab)
        cfg = LogitsConfig(batch_size=batch, gamma=gamma, vocab_size=vocab, logits_dtype=DTYPES[dtype])
        w = make_logits_workload(cfg, device)
        k = reference_outputs(w)["accepted_lengths"].to(torch.int32)
        splits = default_splits(vocab, w.target_logits.element_size())
        every = torch.full_like(k, gamma)
        probes = {"parallel": PositionChain(w.target_logits, w.draft_logits, every, splits, wait=False),
                  "chain-all": PositionChain(w.target_logits, w.draft_logits, every, splits, wait=True),
                  "chain-k": PositionChain(w.target_logits, w.draft_logits, k, splits, wait=True),
                  "chain-k-read-first": PositionChain(w.target_logits, w.draft_logits, k, splits, wait=True,
                                                      read_first=True)}
        fast = w.with_randomness("fast")
        fused = tk.fused_logits_launcher(_inputs(fast), allocate_outputs(fast), True, fast.seed, 0)
        read_rows = int(probes["chain-k"].rows_read().sum())
        for l2 in args.l2.split(","):
            line = {"batch": batch, "gamma": gamma, "vocab": vocab, "dtype": dtype, "l2": l2, "splits": splits,
                    "max_k": int(k.max()), "mean_k": float(k.float().mean()),
                    "rows_read_chain_k": read_rows, "rows": batch * (2 * gamma + 1)}
            for mode, probe in probes.items():
                line[mode] = per_kernel_us(probe.run, args.iters, flushes[l2])[1]
                problem = probe.check()
                if problem:
                    raise RuntimeError(f"{point} {mode}: {problem}")
            kernels, total = per_kernel_us(fused, args.iters, flushes[l2])
            line["fused_logits"], line["fused_logits_pass1"] = total, kernels.get("_row_stats")
            rows.append(line)
            print(" ".join(f"{key}={value:.2f}" if isinstance(value, float) else f"{key}={value}"
                           for key, value in line.items()), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
