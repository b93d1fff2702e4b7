"""Triton kernels for verification from logits (the token rule; block verification in fused_logits) and
their launchers.

Two designs, both equal to `reference.prob_verify_logits` on supplied randomness (up to near-ties at
float32 rounding, see reference.py):

- fused_logits (sdbench, 2 launches, 3 where the race fills the machine above EARLY_MAX_BATCH or without PDL).
  The dependency: the accept
  test at position i needs p_i(x_i) and q_i(x_i), i.e. the softmax normalisers (max, Σexp) of target
  row i and draft row i (a greedy target's only its argmax: it needs no q), and the first rejection k needs
  all of them; the race at k needs rows k again. So:
  1. `_row_stats_kernel`, grid (B·(2γ+1), splits): program (row, s) sweeps its span of one logits
     row (target rows 0..γ, then draft rows 0..γ-1) in steps of `stats_tile` columns (4 KiB), each lane of 16 bytes
     keeping its own online max and Σexp(z - max) (no reduction inside the loop) and (greedy rows) the
     first argmax of z = logits·(1/T). Writes one partial (max, sumexp, argmax) per program. Every logit
     is read at most once, and the kernel is a pure stream. Under the token rule a greedy request's
     draft rows are not read at all (SKIP_GREEDY_DRAFTS): greedy verification accepts x_i iff it is the target's
     argmax and needs no q. The split aims at STATS_WAVES
     waves of the programs an SM holds (the compiled kernel's registers decide how many).
  2. The accept scan (`scan`, `default_scan`): where the race fills the machine, up to b = EARLY_MAX_BATCH
     with PDL, "early": pass 1 and the race launch sequence by sequence, each pass-1 program counts itself done
     for its sequence, and a race program combines and scans as soon as its own sequence is done, so the early
     sequences' races run beside pass 1's last programs; at larger b or without PDL, `_scan_kernel`, grid
     (B,), combines each sequence's partials, scans to k, and writes k, row k's normalisers and the bad-id
     flag, so pass 1 makes no arrival atomics (they cost it ~20%) and the race starts from 7 numbers;
     where it does not, every race program combines and scans itself (the repeats run beside each other,
     and a launch between the passes would add its latency). Also available: "pass1", the sequence's
     last pass-1 row combines its row and scans, with acq_rel arrivals (COMBINE, SCAN).
  3. `_logits_race_kernel`, grid (B, programs), the prob `fused` sampler's shape (a program takes
     `steps` chunks of at most RACE_CHUNK_MAX columns, or RACE_SCAN_CHUNK_MAX where it scans and does not fill
     the machine (scan "race"): `default_race_plan`;
     one wave of programs, at least RACE_MIN_PROGRAMS a sequence, `race_steps`): program (b, c) reads its chunk
     of target row k and draft row k (2 rows per sequence: ~2/(2γ+1) of pass 1), turns them into p and q with
     the row-k normalisers, and (fast mode) stores its chunks' residual masses, from which the last program to
     arrive draws the token by inversion (`_cdf_pick`; where a program takes one chunk, each program also draws a
     candidate in its chunk and the last arrival only chooses the chunk: `default_picks`), or (supplied
     randomness) folds its best race key w/E into best[b] with a 64-bit atomic max; the last arrival writes the
     outputs (greedy targets skip the row: next = argmax of row k).
  On sm_90+ (`pdl_available`) the scan kernel and the race launch with programmatic dependent launch: each
  starts its programs and loads its inputs while the kernel ahead finishes, and waits for it
  (`_wait_for_prior_kernel`) before reading what it wrote (docs/perf-notes.md, "Session 23"); under scan "early" the
  race waits instead for its own sequence's pass-1 count (`_wait_for_sequence`; "Session 40").
- fused_logits with rule="block" (Sun et al., reference.block_stop; 3 launches, 2 when γ = 1). The
  dependency: h_i needs r_i = Σ_x max(0, w_i·p_i(x) - q_i(x)) at every i < γ, a sum over whole rows
  that needs the normalisers (pass 1) and w_i (the ratios at the draft tokens, 2γ gathered logits), and
  τ needs every h_i. So the logits are read twice, the least the rule allows: pass 1 as above; then
  `_block_mass_kernel`, grid (B·(γ-1), splits), one partial of r_i per program (target and draft row i,
  rows 1..γ-1 only; a greedy target row needs none); then `_logits_race_kernel` with RULE="block":
  each program sums the partials in a fixed order (deterministic), takes τ = the largest i with
  η_i < h_i, and races over its chunk of max(0, w_τ·p_τ - q_τ) (p_γ at τ = γ) exactly as the token
  race does at k. The race keys are not drawn in the mass pass for every candidate row (γ-1 rows of
  Philox draws and divisions per column would make it compute-bound): row τ is read again, as row k is.
  RULE is a constexpr: the token path compiles to the same code as before the block rule existed.
- fused_logits with single=True (an experiment, not a default; docs/perf-notes.md, "Session 17"): pass 1's
  and the race's programs in one grid (`_one_launch_kernel`), a race program waiting on its sequence's pass-1
  programs through a count in memory. The kernels' bodies are `_row_stats_program` and `_race_program`, which
  the two-launch kernels call with their program ids.
- fused_logits with timeline=True (a diagnostic, `logits_kernels --timeline`): the two launches compiled with
  TIMELINE, every program storing the global timer at marks (`_mark`, PASS1_MARKS, RACE_MARKS) into buffers the
  launch keeps (`launch.timeline`); with TIMELINE false the kernels compile to the code they have without it.
- vllm_v2_style (the peer, 4 launches): the multi-kernel design described for vLLM's model runner v2
  rejection sampler (vllm/v1/worker/gpu/sample: block max / sum-exp over vocabulary tiles, a
  per-request accept scan, a Gumbel-max resample of the rejected row), re-implemented here from that
  description, not copied: (1) the same block stats kernel with one VLLM_BLOCK tile per program
  (no splitting plan); (2) `_scan_kernel` grid (B,) (fused_logits' own, without the flag): combine the
  blocks, scan, write k and the row-k normalisers; (3) `_vllm_resample_kernel` grid (B, blocks): Gumbel keys log(w) - log(E) over a
  block of row k, per-block (max, argmax) written out; (4) `_vllm_finish_kernel` grid (B,): combine
  the block winners and write the outputs.

Randomness helpers (Philox streams, exponential noise, packed race keys) are imported from
sdbench.ops.prob_verify.triton_kernels, so fast mode draws the same streams as the prob kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from sdbench.ops.input_contract import TOKEN_OUT_OF_RANGE as _TOKEN_OUT_OF_RANGE
from sdbench.ops.prob_verify.triton_kernels import (
    CHUNK_MAX,
    INTERPRETED,
    BoundLaunch,
    _accept_uniforms,
    _chunk_columns,
    _exponential,
    _fast_divide,
    _pack,
    _race_noise,
    _release,
    _token_of,
    default_fused_plan,
    philox_offsets,
)
from sdbench.ops.prob_verify_logits.workload import VLLM_BLOCK

try:
    from triton.language.extra import libdevice
except ImportError:  # older Triton layouts
    from triton.language.extra.cuda import libdevice

TILE = 64 if INTERPRETED else 2048  # columns per step of a block-mass program (16 per thread at 4 warps)
STATS_WARPS = 4
# Pass 1's tile (float32; `stats_tile` sizes other dtypes' to the same 4 KiB): 8 logits per thread at 4 warps, two
# tiles in flight. Measured on the H200 (GPU µs, cold L2, pass
# 1 alone, b=512 γ=8 V=128256, session 6's per-logit max): bf16 631 (2048 with prefetch: 635; without: 933;
# per-tile reductions: 744), fp32 1017 (1064; 1120; 1006): docs/perf-notes.md, "Pass 1 per lane". With
# 16-byte lanes (session 8): bf16 547, fp32 1001.
STATS_TILE = 32 if INTERPRETED else 1024  # float32's step; a step is STATS_TILE·4 bytes of any dtype (stats_tile)
STATS_PROGRAMS_PER_SM = 16  # the block rule's mass pass: programs per SM it aims at (pass 1 sizes itself by waves now)
NO_INDEX = tl.constexpr(2**31 - 1)  # globals a jit function reads must be constexpr
LOWEST = tl.constexpr(-3.4028234663852886e38)  # -FLT_MAX: pass 1's empty lane (see _row_stats_kernel)
LOG2E = tl.constexpr(1.4426950408889634)
NATIVE = tl.constexpr(not INTERPRETED)  # compiled for CUDA: inline PTX (`_exp2`'s FTZ) is available
TOKEN_OUT_OF_RANGE = tl.constexpr(_TOKEN_OUT_OF_RANGE)  # sdbench.ops.input_contract
STREAM_CDF = tl.constexpr(2)  # fast mode's Philox stream of the residual draw by inversion (0: accept, 1: race)
STREAM_PICK = tl.constexpr(3)  # ... and of sample "picks"' candidates (`_pick_in_chunk`)
RACE_PROGRAMS_PER_SM = 16  # the race's programs beyond this run several chunks each (race_steps)
RACE_CHUNK_MAX = 1024  # race columns per step: 8 per thread at 4 warps (2048: 124 registers, 1.5x slower at b=512)
RACE_SCAN_CHUNK_MAX = 2048  # ... where the token race scans in every program (`default_race_plan`)
STATS_MIN_TILES = 4  # pass-1 span once the rows' tiles exceed a wave: per-program fixed costs amortised
STATS_WAVES = 4  # pass 1 aims at this many waves of resident programs (default_stats_plan)
STATS_SPLITS_BELOW_WAVE = 32  # pass-1 partials a row at most where all of pass 1 fits one wave (stats_plan)
STATS_PER_SM_GUESS = 12  # pass 1's resident programs per SM before it is compiled (sm_90, Triton 3.6: float32 12, bf16 9 at 4 KiB steps)
READ_FIRST_MAX_BATCH = 1024  # `_read_first` (an option): its count over the batch loads B temperatures a program
RACE_PER_SM_GUESS = 8  # the race's, likewise (64 registers at 1024-column chunks)
RACE_MIN_PROGRAMS = 4  # race programs a sequence at the least, whatever the wave (race_steps)
RESAMPLE_ROWS = 256  # vllm_v2_style resample: 1024 columns per step of a block
SINGLE_WARPS = 4  # one launch: pass 1's warps; the race's programs run with them too
# timeline builds (`_mark`): int64 slots a program. Pass 1: entry, its partial computed, its SM. The race: entry,
# row k's normalisers known, its chunks done, its arrival counted, the outputs' values known (last arrival only, else
# 0), its SM, whether it arrived last.
PASS1_MARKS = tl.constexpr(4)
RACE_MARKS = tl.constexpr(8)


@triton.jit
def _exp(x, PRECISE_MATH: tl.constexpr):
    if PRECISE_MATH:
        return libdevice.exp(x)  # expf, as PyTorch computes it
    else:
        return tl.exp(x)


@triton.jit
def _inverse_temperature(temperature):
    """1/T rounded once to float32 (IEEE, as PyTorch's 1.0 / T); 1 for greedy rows (T = 0)."""
    safe = tl.where(temperature > 0, temperature, 1.0)
    return tl.where(temperature > 0, tl.math.div_rn(tl.zeros_like(safe) + 1.0, safe), 1.0)


@triton.jit
def _exp2(x, FTZ: tl.constexpr):
    """2^x; FTZ (CUDA): the bare MUFU.EX2 (ex2.approx.ftz), results below 2^-126 flushed to 0. Pass 1's
    terms are summed against a max term of 1, so a flushed term changes no sum; tl.exp2's denormal
    handling costs two instructions a logit."""
    if FTZ:
        return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        return tl.exp2(x)


@triton.jit
def _mark(timeline_ptr, slot, after, TIMELINE: tl.constexpr):
    """Timeline builds only (`logits_kernels --timeline`; TIMELINE False compiles to nothing): the global
    timer (ns) into timeline_ptr[slot], read once `after` (a 32-bit value) is computed. The read is predicated
    on a test of `after`, so ptxas cannot issue it before `after` is ready (an unused asm operand would not
    hold it back)."""
    if TIMELINE:
        # (an `after` whose bits are 0x7fc00001, one NaN pattern, records 0: a mark the reader cannot tell from unset)
        now = tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $1, 0x7fc00001; mov.u64 $0, 0; @p mov.u64 $0, %globaltimer; }",
            "=l,r", [after], dtype=tl.int64, is_pure=False, pack=1)
        tl.store(timeline_ptr + slot, now)


@triton.jit
def _sm_id(TIMELINE: tl.constexpr):
    """The SM a program runs on (timeline builds), else 0."""
    if TIMELINE:
        return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [tl.zeros([], tl.int32)], dtype=tl.int32,
                                         is_pure=False, pack=1)
    else:
        return tl.zeros([], tl.int32)


# Programmatic dependent launch (sm_90+; `pdl_available`). A kernel launched with launch_pdl may start its programs
# before the kernel ahead of it in the stream has finished: once every program of that one has passed
# `_let_next_kernel_start`. It reads what that kernel writes only after `_wait_for_prior_kernel`, which returns once
# that kernel has completed and its writes are visible (on a launch without the attribute it returns at once). So
# the next kernel's launch, its programs' start and its loads of inputs overlap the tail of the one before. Own
# inline PTX, not side-effect free, so that no Triton version drops the trigger as an unused pure value.
@triton.jit
def _let_next_kernel_start(PDL: tl.constexpr):
    if PDL:
        tl.inline_asm_elementwise("griddepcontrol.launch_dependents; mov.u32 $0, 0;", "=r,r",
                                  [tl.zeros([], tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _wait_for_prior_kernel(PDL: tl.constexpr):
    if PDL:
        tl.inline_asm_elementwise("griddepcontrol.wait; mov.u32 $0, 0;", "=r,r", [tl.zeros([], tl.int32)],
                                  dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _fold_tile(x, m, s, arg, first_cols, scale, greedy, FTZ: tl.constexpr):
    """Fold one tile x [lanes, VEC] into each lane's running max m, Σ2^((x - m)·scale) s and (greedy rows)
    first argmax, over the lane's VEC logits at once: a max over VEC values in one thread, then one
    exp2 per logit and one per lane to rescale s (ptxas for sm_90 with Triton 3.9: 8.5 instructions a logit with
    bf16's conversion as an unpack and a shift, 7.6 with `_load_tile`'s words; a running max per logit took about
    twice). m runs on the raw logits; -FLT_MAX start, so a -inf logit adds 2^-inf = 0 and never NaN. (The exponent
    as one FFMA, x·scale - m·scale, was measured and lost on the H200, and a row at -FLT_MAX overflows m·scale:
    docs/perf-notes.md, "Session 35".)"""
    tile_max = tl.max(x, axis=1)
    grown = tl.maximum(m, tile_max)
    terms = _exp2((x - grown[:, None]) * scale, FTZ)
    s = s * _exp2((m - grown) * scale, FTZ) + tl.sum(terms, axis=1)
    if greedy:  # the first column of the lane's max: a strictly larger tile max, or the lane's first finite one
        first = first_cols + tl.argmax(x, axis=1, tie_break_left=True).to(tl.int32)
        arg = tl.where((tile_max > m) | ((arg == NO_INDEX) & (tile_max == grown)), first, arg)
    return grown, s, arg


@triton.jit
def _load_tile(base, first, offsets, words, WORDS: tl.constexpr, TILE: tl.constexpr, VEC: tl.constexpr):
    """Columns [first, first + TILE) of a row as float32 [TILE // VEC, VEC]. WORDS (bf16 rows at 4-byte
    alignment): loaded as 32-bit words, two logits each, widened by a shift (the low one) and a mask (the high one):
    one instruction a logit, where the conversion compiles to a 16-bit unpack and then a shift (ptxas, sm_90). Exact:
    bf16 widens to float32 by its bits. Pass 1 issues ~13 instructions a logit at 4-step spans, so this is ~1 in 13
    (docs/perf-notes.md, "Session 35")."""
    if WORDS:
        w = tl.load((base + first).to(tl.pointer_type(tl.int32)) + words)
        low = (w << 16).to(tl.float32, bitcast=True)
        high = (w & -65536).to(tl.float32, bitcast=True)
        return tl.reshape(tl.join(low, high), [TILE // VEC, VEC])  # (word j: columns 2j, 2j + 1)
    else:
        return tl.load(base + first + offsets).to(tl.float32)


# --- pass 1: per-row (max, Σexp, argmax) partials -----------------------------------------------
@triton.jit
def _row_stats_program(
    row, split, target_ptr, draft_ptr, target_temp_ptr, draft_temp_ptr, stats_max_ptr, stats_sum_ptr, stats_arg_ptr,
    row_max_ptr, row_sum_ptr, row_arg_ptr, arrivals_ptr,
    draft_tokens_ptr, uniforms_ptr, offsets_ptr, sequence_arrivals_ptr, stop_ptr, error_flags_ptr, timeline_ptr,
    seed, vocab, span, splits, stride_p_b, stride_p_row, stride_q_b, stride_q_row, stride_tok_b, stride_u_b,
    GAMMA: tl.constexpr, TILE: tl.constexpr, COMBINE: tl.constexpr, SPLITS_PAD: tl.constexpr,
    SCAN: tl.constexpr, GAMMA_PAD: tl.constexpr, R_PAD: tl.constexpr, PRECISE_MATH: tl.constexpr,
    FAST: tl.constexpr, VEC: tl.constexpr, FTZ_EXP2: tl.constexpr, TIMELINE: tl.constexpr,
    SKIP_GREEDY_DRAFTS: tl.constexpr, WORDS: tl.constexpr,
):
    """Pass 1's program (row, s), grid (B·(2γ+1), splits) in `_row_stats_kernel`: columns
    [s·span, min((s+1)·span, V)) of one row, TILE at a time, as TILE/VEC lanes of VEC adjacent logits (one 16-byte load a lane: VEC = 8 bf16 or 4 fp32).
    Each lane keeps its own running max m and Σexp(z - m) (and, on a greedy row, the first column of its
    max), folding in its VEC logits of a tile at once (`_fold_tile`), so the loop needs no reduction
    across threads; the lanes combine once, at the end of the span. m runs on the raw logits (c =
    log2(e)/T folds the temperature into the exponent's multiply); the stored max is max(x)·(1/T), the
    same float as max(x·(1/T)), since rounding a product by a positive number is monotonic. The span's
    whole tiles load unmasked, the next one while this one is folded in (two tiles in flight per program);
    only the row's last, partial tile is masked (-inf: it adds 2^-inf = 0; a span of -inf logits leaves s
    = 0). Registers (bf16 at 1024-column steps, measured with ptxas for sm_90): 40 a thread, against 63 with a
    running max per logit. Resident programs per SM as the launcher reads them on the H200 (Triton 3.6):
    float32 12; bf16 16 at 1024-column steps, 9 at 4 KiB steps (the plans are sized to them).
    COMBINE (fused_logits): the row's last program to arrive (arrivals_ptr, int32 per row, left zeroed)
    combines the row's `splits` partials into row_*_ptr[row] (one program per row writes there directly),
    so the race reads 2γ+1 numbers per sequence, not (2γ+1)·splits in every one of its programs (the block
    rule, scan "pass1"). Without it (scan "kernel" and vllm_v2_style, whose `_scan_kernel` combines them
    once a sequence; scan "race" below a wave) the partials are the output.
    SCAN (fused_logits, token rule; needs COMBINE): the sequence's last row to be combined (a second arrival
    counter, per sequence) runs the accept scan once for the sequence (`_scan_in_pass_one`), so the race's
    programs start from k instead of each gathering 2γ logits and scanning.
    SKIP_GREEDY_DRAFTS (the token rule): a draft row of a request whose target is greedy reads nothing and leaves
    the empty span's partial (max -inf, Σ 0). Greedy verification needs no q: it accepts x_i iff x_i is the
    target's argmax (`_accept_scan` takes q := 0, as the reference does), and its next token is row k's argmax, so
    those γ rows are never needed.
    (The block rule's weights p/q need q whatever the target: it keeps this off.)"""
    b = (row // (2 * GAMMA + 1)).to(tl.int64)
    r = row % (2 * GAMMA + 1)
    mark = (row * splits + split) * PASS1_MARKS
    _mark(timeline_ptr, mark, row, TIMELINE)
    if r <= GAMMA:
        base = target_ptr + b * stride_p_b + r * stride_p_row
        temperature = tl.load(target_temp_ptr + b)
    else:
        base = draft_ptr + b * stride_q_b + (r - GAMMA - 1) * stride_q_row
        temperature = tl.load(draft_temp_ptr + b)
    inverse = _inverse_temperature(temperature)
    scale = inverse * LOG2E
    greedy = temperature == 0
    start = split * span
    end = tl.minimum(start + span, vocab)
    if SKIP_GREEDY_DRAFTS:
        if r > GAMMA:  # a draft row: nothing to read where the request's target is greedy (an empty span)
            end = tl.where(tl.load(target_temp_ptr + b) == 0, start, end)
    lanes = tl.arange(0, TILE // VEC)
    offsets = lanes[:, None] * VEC + tl.arange(0, VEC)[None, :]  # [lanes, VEC]: one 16-byte load a lane
    words = lanes[:, None] * (VEC // 2) + tl.arange(0, VEC // 2)[None, :]  # WORDS: the same bytes as 32-bit words
    m = tl.full([TILE // VEC], LOWEST, tl.float32)
    s = tl.zeros([TILE // VEC], tl.float32)
    arg = tl.full([TILE // VEC], NO_INDEX, tl.int32)
    full_tiles = (end - start) // TILE
    if full_tiles > 0:  # the span's whole tiles, no mask: the next tile loads while this one is folded in
        x = _load_tile(base, start, offsets, words, WORDS, TILE, VEC)
        for t in range(1, full_tiles + 1):
            # the last step re-loads the last whole tile (an L1 hit) rather than read past the whole tiles
            next_x = _load_tile(base, start + tl.minimum(t, full_tiles - 1) * TILE, offsets, words, WORDS, TILE, VEC)
            m, s, arg = _fold_tile(x, m, s, arg, start + (t - 1) * TILE + lanes * VEC, scale, greedy, FTZ_EXP2)
            x = next_x
    tail = start + full_tiles * TILE
    if tail < end:  # the row's last, partial tile
        cols = tail + offsets
        x = tl.load(base + cols, mask=cols < end, other=float("-inf")).to(tl.float32)
        m, s, arg = _fold_tile(x, m, s, arg, tail + lanes * VEC, scale, greedy, FTZ_EXP2)
    row_max = tl.max(m, axis=0)
    total = tl.sum(s * tl.exp2((m - row_max) * scale), axis=0)
    first = tl.full([], NO_INDEX, tl.int32)
    if greedy:  # only greedy rows read their argmax: the others skip a third reduction
        first = tl.min(tl.where(m == row_max, arg, NO_INDEX), axis=0)
    row_max = tl.where(total > 0, row_max * inverse, float("-inf"))  # Σ = 0 only when every logit is -inf
    _mark(timeline_ptr, mark + 1, total.to(tl.int32, bitcast=True), TIMELINE)
    if TIMELINE:
        tl.store(timeline_ptr + mark + 2, _sm_id(TIMELINE).to(tl.int64))
    if COMBINE and splits == 1:
        tl.store(row_max_ptr + row, row_max)
        tl.store(row_sum_ptr + row, total)
        tl.store(row_arg_ptr + row, first)
        if SCAN:
            _scan_in_pass_one(row_max_ptr, row_sum_ptr, row_arg_ptr, draft_tokens_ptr, target_ptr, draft_ptr,
                              target_temp_ptr, draft_temp_ptr, uniforms_ptr, offsets_ptr, sequence_arrivals_ptr,
                              stop_ptr, error_flags_ptr, b, seed, vocab, stride_tok_b, stride_p_b, stride_p_row,
                              stride_q_b, stride_q_row, stride_u_b, GAMMA, GAMMA_PAD, R_PAD, PRECISE_MATH, FAST)
    else:
        out = row * SPLITS_PAD + split  # (rows SPLITS_PAD apart: `allocate_stats`)
        tl.store(stats_max_ptr + out, row_max)
        tl.store(stats_sum_ptr + out, total)
        tl.store(stats_arg_ptr + out, first)
        if COMBINE:
            # release: this program's partial is visible before its arrival; the last arrival acquires all
            if tl.atomic_add(arrivals_ptr + row, 1, sem="acq_rel") == splits - 1:
                # `_rows_stats`' formula for one row, written out: through `_rows_stats` (a [2, SPLITS_PAD] tile, then
                # a pick) the block rule took 0.2-0.8 µs longer at b = 32, V = 32000, bf16, warm, on the H100
                # (docs/perf-notes.md, "Session 28"): this combine is the row's last arrival's, on the critical path
                parts = row * SPLITS_PAD + tl.arange(0, SPLITS_PAD)
                valid = tl.arange(0, SPLITS_PAD) < splits
                # (new names: a tensor must keep its shape across Triton's branches; unmasked, so they load as
                # vectors; the padding after the row's splits is never used: `_rows_stats`)
                part_max = tl.where(valid, tl.load(stats_max_ptr + parts, cache_modifier=".cg"), float("-inf"))
                part_sum = tl.load(stats_sum_ptr + parts, cache_modifier=".cg")
                part_arg = tl.load(stats_arg_ptr + parts, cache_modifier=".cg")
                combined_max = tl.max(part_max, axis=0)
                scaled = tl.where(valid, part_sum * tl.exp(part_max - combined_max), 0.0)
                tl.store(row_max_ptr + row, combined_max)
                tl.store(row_sum_ptr + row, tl.sum(scaled, axis=0))
                tl.store(row_arg_ptr + row, tl.min(tl.where(valid & (part_max == combined_max), part_arg, NO_INDEX),
                                                   axis=0))
                tl.store(arrivals_ptr + row, 0)  # every program of the row has arrived: the next launch starts clean
                if SCAN:
                    _scan_in_pass_one(row_max_ptr, row_sum_ptr, row_arg_ptr, draft_tokens_ptr, target_ptr, draft_ptr,
                                      target_temp_ptr, draft_temp_ptr, uniforms_ptr, offsets_ptr,
                                      sequence_arrivals_ptr, stop_ptr, error_flags_ptr, b, seed, vocab, stride_tok_b,
                                      stride_p_b, stride_p_row, stride_q_b, stride_q_row, stride_u_b,
                                      GAMMA, GAMMA_PAD, R_PAD, PRECISE_MATH, FAST)


@triton.jit(do_not_specialize=["seed"])
def _row_stats_kernel(
    target_ptr, draft_ptr, target_temp_ptr, draft_temp_ptr, stats_max_ptr, stats_sum_ptr, stats_arg_ptr,
    row_max_ptr, row_sum_ptr, row_arg_ptr, arrivals_ptr,
    draft_tokens_ptr, uniforms_ptr, offsets_ptr, sequence_arrivals_ptr, stop_ptr, error_flags_ptr, timeline_ptr,
    done_ptr, seed, vocab, span, splits, stride_p_b, stride_p_row, stride_q_b, stride_q_row, stride_tok_b, stride_u_b,
    GAMMA: tl.constexpr, TILE: tl.constexpr, COMBINE: tl.constexpr, SPLITS_PAD: tl.constexpr,
    SCAN: tl.constexpr, GAMMA_PAD: tl.constexpr, R_PAD: tl.constexpr, PRECISE_MATH: tl.constexpr,
    FAST: tl.constexpr, VEC: tl.constexpr, FTZ_EXP2: tl.constexpr, TIMELINE: tl.constexpr, PDL: tl.constexpr,
    SKIP_GREEDY_DRAFTS: tl.constexpr, WORDS: tl.constexpr, READ_FIRST: tl.constexpr, BATCH_PAD: tl.constexpr,
    SEQUENCE_DONE: tl.constexpr,
):
    """Pass 1 as a launch of its own: program (row, split) is `_row_stats_program`'s, or (READ_FIRST) the work
    `_read_first` gives the program in its place. PDL: the kernel after it (launched with launch_pdl) may start its
    programs as soon as all of pass 1's have started.
    SEQUENCE_DONE (scan "early"): the programs launch sequence by sequence (launch index i = split_id·rows + row_id
    is split i % splits of row i // splits), so the sequences finish one after another, not all in the last wave;
    each program counts itself done for its sequence (done_ptr, int32 [B], `_count_done`), and a race program
    starts on its sequence once that count is full (`_wait_for_sequence`), not once the whole of pass 1 is."""
    _let_next_kernel_start(PDL)
    row, split = tl.program_id(0), tl.program_id(1)
    if READ_FIRST:
        row, split = _read_first(row, split, target_temp_ptr, GAMMA, BATCH_PAD)
    if SEQUENCE_DONE:
        row, split = _sequence_by_sequence(row, split)
    _row_stats_program(
        row, split, target_ptr, draft_ptr, target_temp_ptr, draft_temp_ptr, stats_max_ptr,
        stats_sum_ptr, stats_arg_ptr, row_max_ptr, row_sum_ptr, row_arg_ptr, arrivals_ptr, draft_tokens_ptr,
        uniforms_ptr, offsets_ptr, sequence_arrivals_ptr, stop_ptr, error_flags_ptr, timeline_ptr, seed, vocab, span,
        splits, stride_p_b, stride_p_row, stride_q_b, stride_q_row, stride_tok_b, stride_u_b, GAMMA, TILE, COMBINE,
        SPLITS_PAD, SCAN, GAMMA_PAD, R_PAD, PRECISE_MATH, FAST, VEC, FTZ_EXP2, TIMELINE, SKIP_GREEDY_DRAFTS, WORDS)
    if SEQUENCE_DONE:
        _count_done(done_ptr, row // (2 * GAMMA + 1))


@triton.jit
def _sequence_by_sequence(x, y):
    """Program (x, y) of a grid (X, Y) renumbered so that launch order, x fastest (launch index i = y·X + x), runs
    y fastest: it takes (i // Y, i % Y). Scan "early" launches pass 1's (row, split) and the race's (sequence,
    chunk) grids through it: blocks are dispatched in launch order, so the sequences' programs start, and finish,
    one sequence after another rather than all in the last wave."""
    index = y * tl.num_programs(0) + x
    return index // tl.num_programs(1), index % tl.num_programs(1)


@triton.jit
def _count_done(done_ptr, b):
    """A pass-1 program of sequence b counts itself done (done_ptr, int32 [B]), after its partial: the barrier
    orders every thread's stores before the one release (the pattern of a grid barrier's arrival). Triton 3.9 puts a
    barrier before a scalar atomic of its own; this one does not rely on it (test_logits_compile checks a bar.sync
    sits between the last store and the release)."""
    tl.debug_barrier()
    tl.atomic_add(done_ptr + b, 1, sem="release")


@triton.jit
def _wait_for_sequence(done_ptr, b, count):
    """A race program waits until `count` pass-1 programs of sequence b are done (acquire: their partials are then
    visible; read them with .cg, since another program of this SM may have left a stale L1 line of them)."""
    done = tl.atomic_add(done_ptr + b, 0, sem="acquire")
    while done < count:
        done = tl.atomic_add(done_ptr + b, 0, sem="acquire")


@triton.jit
def _read_first(program_row, program_split, target_temp_ptr, GAMMA: tl.constexpr, BATCH_PAD: tl.constexpr):
    """(row, split) for pass-1 program (program_row, program_split), numbered so that the programs that read come
    first in launch order and the empty ones (SKIP_GREEDY_DRAFTS: a greedy request's draft rows) last.
    Why: where pass 1 fits in one wave, the GPU deals its programs out over the SMs in launch order (x fastest),
    all at once. In row order a greedy request's γ empty programs of a split are adjacent, and with one request in
    four greedy they recur every 4·(2γ+1) launch indices; at b = 32, γ = 8 that is 68, and 2·68 = 136 is 4 more than
    the 132 SMs, so they pile up on the same SMs: some SMs ran 3 reading programs and others 9 (docs/perf-notes.md,
    "Session 37"). Dealt out first, the reading programs
    spread evenly (8 at most there). The empty ones still run, last, and still write their empty partials.
    Measured on the H200 (the same session): the SMs evened out (7 to 8 reading programs each) and pass 1 was no
    faster, and slower where it runs several waves (the count costs registers and a load before the first tile),
    so the SMs' share of the work was not what bounded it. An option (fused_logits_launcher's read_first), off.
    Order: launch index i = split·rows + row; the reading rows are every target row (B·(γ+1), request by
    request) and then the draft rows of requests whose target samples; i < reading rows·splits is split
    i // reading rows of reading row i % reading rows, and the rest likewise over the empty rows. The n-th
    request of a kind is found by a count over the batch's target temperatures (BATCH_PAD of them, one L2 load
    a program: the launcher turns this on only up to READ_FIRST_MAX_BATCH)."""
    rows = tl.num_programs(0)
    splits = tl.num_programs(1)
    batch = rows // (2 * GAMMA + 1)
    requests = tl.arange(0, BATCH_PAD)
    in_batch = requests < batch
    temperature = tl.load(target_temp_ptr + requests, mask=in_batch, other=0.0)
    sampled = ((temperature != 0) & in_batch).to(tl.int32)
    greedy = ((temperature == 0) & in_batch).to(tl.int32)
    reading_rows = batch * (GAMMA + 1) + GAMMA * tl.sum(sampled, axis=0)
    empty_rows = tl.maximum(rows - reading_rows, 1)  # (no empty rows: no program lands there; no division by 0)
    index = program_split * rows + program_row
    reads = index < reading_rows * splits
    past = index - reading_rows * splits
    split = tl.where(reads, index // reading_rows, past // empty_rows)
    j = tl.where(reads, index % reading_rows, past % empty_rows)  # the row's place among its kind
    target = reads & (j < batch * (GAMMA + 1))
    draft = tl.where(reads, j - batch * (GAMMA + 1), j)  # the draft row's place among its kind's draft rows
    # the (draft // γ)-th request of the kind: how many requests come before the kind's count passes it
    kind = tl.where(reads, sampled, greedy)
    request = tl.sum((tl.cumsum(kind, axis=0) <= draft // GAMMA).to(tl.int32), axis=0)
    row = tl.where(target, (j // (GAMMA + 1)) * (2 * GAMMA + 1) + j % (GAMMA + 1),
                   request * (2 * GAMMA + 1) + GAMMA + 1 + draft % GAMMA)
    return row, split


@triton.jit
def _scan_in_pass_one(row_max_ptr, row_sum_ptr, row_arg_ptr, draft_tokens_ptr, target_ptr, draft_ptr,
                      target_temp_ptr, draft_temp_ptr, uniforms_ptr, offsets_ptr, sequence_arrivals_ptr, stop_ptr,
                      error_flags_ptr, b, seed, vocab, stride_tok_b, stride_p_b, stride_p_row, stride_q_b,
                      stride_q_row, stride_u_b, GAMMA: tl.constexpr, GAMMA_PAD: tl.constexpr, R_PAD: tl.constexpr,
                      PRECISE_MATH: tl.constexpr, FAST: tl.constexpr):
    """Called by the program that wrote a row's combined stats: the sequence's last such row (of 2γ+1;
    release/acquire on sequence_arrivals_ptr, int32 [B], left zeroed) runs the accept scan and writes the
    stop k (stop_ptr, int32 [B]) and the sequence's error flag. Fast mode reads the Philox offset the race
    reads (the race's last arrival advances it), so both draw the same accept uniforms."""
    if tl.atomic_add(sequence_arrivals_ptr + b, 1, sem="acq_rel") == 2 * GAMMA:
        rows = tl.arange(0, R_PAD)
        valid = rows < 2 * GAMMA + 1
        first_row = b * (2 * GAMMA + 1)
        # .cg: other programs wrote these rows in this launch; read them from L2, not a stale L1 line
        row_max = tl.load(row_max_ptr + first_row + rows, mask=valid, other=float("-inf"), cache_modifier=".cg")
        row_sum = tl.load(row_sum_ptr + first_row + rows, mask=valid, other=0.0, cache_modifier=".cg")
        row_arg = tl.load(row_arg_ptr + first_row + rows, mask=valid, other=NO_INDEX, cache_modifier=".cg")
        temperature_t, temperature_d = tl.load(target_temp_ptr + b), tl.load(draft_temp_ptr + b)
        offset = _philox_offset(offsets_ptr, b, FAST)
        tokens, target_logit, draft_logit = _draft_token_logits(draft_tokens_ptr, target_ptr, draft_ptr, b, vocab,
                                                                stride_tok_b, stride_p_b, stride_p_row, stride_q_b,
                                                                stride_q_row, GAMMA, GAMMA_PAD)
        k, bad = _accept_scan(tokens, target_logit, draft_logit, uniforms_ptr, b, vocab, row_max, row_sum, row_arg,
                              _inverse_temperature(temperature_t), _inverse_temperature(temperature_d),
                              temperature_t == 0, temperature_d == 0, seed, offset, stride_u_b, GAMMA, GAMMA_PAD,
                              R_PAD, PRECISE_MATH, FAST)
        tl.store(stop_ptr + b, k)
        tl.store(error_flags_ptr + b, bad * TOKEN_OUT_OF_RANGE)
        tl.store(sequence_arrivals_ptr + b, 0)


@triton.jit
def _combined_stats(stats_max_ptr, stats_sum_ptr, stats_arg_ptr, b, splits,
                    GAMMA: tl.constexpr, R_PAD: tl.constexpr, SPLITS_PAD: tl.constexpr, CACHE: tl.constexpr):
    """Row max M, Σexp(z - M) S and first argmax A of sequence b's 2γ+1 rows ([R_PAD] each). CACHE ".cg" where
    the partials were written by programs still running (`_one_launch_kernel`; the early race, SEQUENCE_WAIT): read
    from L2, never a stale L1 line;
    "" otherwise (a constexpr with no default: Triton 3.6 does not wrap a default string as a constexpr)."""
    return _rows_stats(stats_max_ptr, stats_sum_ptr, stats_arg_ptr, b * (2 * GAMMA + 1), 2 * GAMMA + 1, splits,
                       R_PAD, SPLITS_PAD, CACHE)


@triton.jit
def _rows_stats(stats_max_ptr, stats_sum_ptr, stats_arg_ptr, first_row, rows, splits,
                PAD: tl.constexpr, SPLITS_PAD: tl.constexpr, CACHE: tl.constexpr):
    """(M, S, A) [PAD] of the `rows` logits rows first_row, first_row + 1, ..., each combined over its `splits`
    partials (rows past `rows`: M = -inf, S = 0, A = NO_INDEX). A row's partials lie SPLITS_PAD apart
    (`allocate_stats`), a stride Triton knows, and load masked by row only, so whole 16-byte vectors of them load at
    once; the padding past `splits` (pass 1 never writes it) is replaced after the load. (Masked by `parts < splits`
    with the stride `splits`, the loads were scalar wherever splits was not a multiple of 16, the only integers
    Triton specialises on: at b = 1, γ = 16, V = 151936, fp32, 30 partials a row, the race's PTX had 101 global
    loads, none of them vectors; with the stride known, 74 with six vectors, and 7 programs an SM instead of 4;
    docs/perf-notes.md, "Session 27".) Every row's combine is the same formula whatever PAD, but the addition tree
    follows the layout of the [PAD, SPLITS_PAD] tile, so two callers with different PADs can differ in S's last bit;
    the max and the argmax agree exactly."""
    row = tl.arange(0, PAD)[:, None]
    parts = tl.arange(0, SPLITS_PAD)[None, :]
    in_rows = tl.broadcast_to(row < rows, [PAD, SPLITS_PAD])
    valid = in_rows & (parts < splits)
    index = (first_row + row) * SPLITS_PAD + parts
    m = tl.load(stats_max_ptr + index, mask=in_rows, other=float("-inf"), cache_modifier=CACHE)
    s = tl.load(stats_sum_ptr + index, mask=in_rows, other=0.0, cache_modifier=CACHE)
    a = tl.load(stats_arg_ptr + index, mask=in_rows, other=NO_INDEX, cache_modifier=CACHE)
    m = tl.where(valid, m, float("-inf"))
    row_max = tl.max(m, axis=1)
    scaled = tl.where(valid, s * tl.exp(m - row_max[:, None]), 0.0)
    # the sum and the first argmax in one reduction (one pass of shuffles and barriers, the same sums as tl.sum)
    row_sum, row_arg = tl.reduce((scaled, tl.where(valid & (m == row_max[:, None]), a, NO_INDEX)), 1, _sum_min)
    return row_max, row_sum, row_arg


@triton.jit
def _position_stats(stats_max_ptr, stats_sum_ptr, stats_arg_ptr, b, splits,
                    GAMMA: tl.constexpr, GAMMA_PAD: tl.constexpr, SPLITS_PAD: tl.constexpr, CACHE: tl.constexpr):
    """What the accept scan and the race read of sequence b's stats, combined row by row with no [R_PAD] vector
    to pick from: position i's target row i and draft row i ([GAMMA_PAD] each), and the bonus row γ (scalars).
    Three small combines in place of one over all 2γ+1 rows and then six picks of [GAMMA_PAD, R_PAD] (at γ = 16
    those took the race's entry-to-k from 2.25 to 5.25 µs on the H100: docs/perf-notes.md, "Session 26")."""
    first = b * (2 * GAMMA + 1)
    max_t, sum_t, arg_t = _rows_stats(stats_max_ptr, stats_sum_ptr, stats_arg_ptr, first, GAMMA, splits,
                                      GAMMA_PAD, SPLITS_PAD, CACHE)
    max_d, sum_d, arg_d = _rows_stats(stats_max_ptr, stats_sum_ptr, stats_arg_ptr, first + GAMMA + 1, GAMMA, splits,
                                      GAMMA_PAD, SPLITS_PAD, CACHE)
    bonus_max, bonus_sum, bonus_arg = _rows_stats(stats_max_ptr, stats_sum_ptr, stats_arg_ptr, first + GAMMA, 1,
                                                  splits, 2, SPLITS_PAD, CACHE)
    bonus = tl.arange(0, 2) == 0  # (a pick: a sum of the one value and a zero, exact)
    bonus_max, bonus_sum, bonus_arg = tl.reduce((tl.where(bonus, bonus_max, 0.0), tl.where(bonus, bonus_sum, 0.0),
                                                 tl.where(bonus, bonus_arg, 0)), 0, _sum3)
    return max_t, sum_t, arg_t, max_d, sum_d, arg_d, bonus_max, bonus_sum, bonus_arg


@triton.jit
def _pick_position_stats(max_t, sum_t, arg_t, max_d, sum_d, arg_d, bonus_max, bonus_sum, bonus_arg, k,
                         GAMMA: tl.constexpr, GAMMA_PAD: tl.constexpr):
    """`_pick_stop_stats` from `_position_stats`' vectors: (M, S, A) of target row k (the bonus row at k = γ) and
    of draft row min(k, γ - 1), six picks in one reduction."""
    positions = tl.arange(0, GAMMA_PAD)
    at_k = positions == k
    at_d = positions == tl.minimum(k, GAMMA - 1)
    m_t, s_t, a_t, m_d, s_d, a_d = tl.reduce((tl.where(at_k, max_t, 0.0), tl.where(at_k, sum_t, 0.0),
                                              tl.where(at_k, arg_t, 0), tl.where(at_d, max_d, 0.0),
                                              tl.where(at_d, sum_d, 0.0), tl.where(at_d, arg_d, 0)), 0, _sum6)
    at_bonus = k >= GAMMA
    return (tl.where(at_bonus, bonus_max, m_t), tl.where(at_bonus, bonus_sum, s_t), tl.where(at_bonus, bonus_arg, a_t),
            m_d, s_d, a_d)


# Combine functions of tuple reductions: several values reduced in one `tl.reduce` share its shuffles and (at 4
# warps) its shared-memory barriers. Joining the accept scan's ~17 reductions into four took 0.1-0.3 µs off the
# race and 0.2-0.5 µs off the scan kernel on the H100, less than predicted: its chain from entry to k is mostly
# dependent loads (docs/perf-notes.md, "Session 21"). A pick (a sum of one value and zeros) is exact in any order.
@triton.jit
def _sum_min(a, x, b, y):
    return a + b, tl.minimum(x, y)


@triton.jit
def _sum_max(a, x, b, y):
    return a + b, tl.maximum(x, y)


@triton.jit
def _min_max(a, x, b, y):
    return tl.minimum(a, b), tl.maximum(x, y)


@triton.jit
def _sum3(a0, a1, a2, b0, b1, b2):
    return a0 + b0, a1 + b1, a2 + b2


@triton.jit
def _sum6(a0, a1, a2, a3, a4, a5, b0, b1, b2, b3, b4, b5):
    return a0 + b0, a1 + b1, a2 + b2, a3 + b3, a4 + b4, a5 + b5


@triton.jit
def _pick(values, index, R_PAD: tl.constexpr):
    """values[index] for a [R_PAD] vector and a scalar index."""
    return tl.sum(tl.where(tl.arange(0, R_PAD) == index, values, 0), axis=0)


@triton.jit
def _pick_stop_stats(row_max, row_sum, row_arg, k, draft_index, R_PAD: tl.constexpr):
    """(M, S, A) of rows k and draft_index ([R_PAD] vectors, scalar indices): six picks in one reduction."""
    at_k = tl.arange(0, R_PAD) == k
    at_d = tl.arange(0, R_PAD) == draft_index
    return tl.reduce((tl.where(at_k, row_max, 0.0), tl.where(at_k, row_sum, 0.0), tl.where(at_k, row_arg, 0),
                      tl.where(at_d, row_max, 0.0), tl.where(at_d, row_sum, 0.0), tl.where(at_d, row_arg, 0)),
                     0, _sum6)


@triton.jit
def _probability(logit, inverse, row_max, row_sum, greedy, is_argmax, PRECISE_MATH: tl.constexpr):
    """p = exp(z - M) / S at one logit, or 1/0 (argmax or not) on a greedy row."""
    z = logit.to(tl.float32) * inverse
    soft = tl.math.div_rn(_exp(z - row_max, PRECISE_MATH), row_sum)
    return tl.where(greedy, tl.where(is_argmax, 1.0, 0.0), soft)


@triton.jit
def _draft_token_logits(draft_tokens_ptr, target_ptr, draft_ptr, b, vocab, stride_tok_b, stride_p_b, stride_p_row,
                        stride_q_b, stride_q_row, GAMMA: tl.constexpr, GAMMA_PAD: tl.constexpr):
    """(the draft tokens x_i, target logit z_i(x_i), draft logit) over positions [GAMMA_PAD]: two dependent
    loads (the tokens, then 2γ gathered logits). A token outside [0, V) is never read through (logit 0).
    Where a caller issues this against its stats' load is measured (docs/perf-notes.md, "Session 21"):
    `_scan_kernel` calls it first, so its [R_PAD, splits] partials load waits beside the tokens' (with the tuple
    reductions, its kernel 0.4-0.7 µs shorter on the H200); the race program and the others call it after
    their stats' load (first, it made the race at b = 1, γ = 16, V = 151936, fp32 0.4 µs longer)."""
    positions = tl.arange(0, GAMMA_PAD)
    in_draft = positions < GAMMA
    tokens = tl.load(draft_tokens_ptr + b * stride_tok_b + positions, mask=in_draft, other=0).to(tl.int64)
    readable = in_draft & (tokens >= 0) & (tokens < vocab)
    target_logit = tl.load(target_ptr + b * stride_p_b + positions * stride_p_row + tokens, mask=readable, other=0.0)
    draft_logit = tl.load(draft_ptr + b * stride_q_b + positions * stride_q_row + tokens, mask=readable, other=0.0)
    return tokens, target_logit, draft_logit


@triton.jit
def _draft_token_probs(tokens, target_logit, draft_logit, vocab, row_max, row_sum, row_arg,
                       inverse_t, inverse_d, greedy_t, greedy_d,
                       GAMMA: tl.constexpr, GAMMA_PAD: tl.constexpr, R_PAD: tl.constexpr,
                       PRECISE_MATH: tl.constexpr):
    """(p_i(x_i), q_i(x_i), which draft tokens are outside [0, V)) over positions [GAMMA_PAD], from
    `_draft_token_logits`' tokens and gathered logits and the sequence's rows' stats ([R_PAD]): `_token_probs`
    after six picks of each position's target row i and draft row γ+1+i."""
    positions = tl.arange(0, GAMMA_PAD)
    # each position's target row i and draft row γ+1+i: six picks ([GAMMA_PAD, R_PAD]) in one reduction
    rows = tl.arange(0, R_PAD)[None, :]
    at_t = rows == positions[:, None]
    at_d = rows == positions[:, None] + GAMMA + 1
    max_t, sum_t, arg_t, max_d, sum_d, arg_d = tl.reduce(
        (tl.where(at_t, row_max[None, :], 0.0), tl.where(at_t, row_sum[None, :], 0.0),
         tl.where(at_t, row_arg[None, :], 0), tl.where(at_d, row_max[None, :], 0.0),
         tl.where(at_d, row_sum[None, :], 0.0), tl.where(at_d, row_arg[None, :], 0)),
        1, _sum6)
    return _token_probs(tokens, target_logit, draft_logit, vocab, max_t, sum_t, arg_t, max_d, sum_d, arg_d,
                        inverse_t, inverse_d, greedy_t, greedy_d, GAMMA, GAMMA_PAD, PRECISE_MATH)


@triton.jit
def _token_probs(tokens, target_logit, draft_logit, vocab, max_t, sum_t, arg_t, max_d, sum_d, arg_d,
                 inverse_t, inverse_d, greedy_t, greedy_d, GAMMA: tl.constexpr, GAMMA_PAD: tl.constexpr,
                 PRECISE_MATH: tl.constexpr):
    """(p_i(x_i), q_i(x_i), which draft tokens are outside [0, V)) over positions [GAMMA_PAD], from the tokens,
    their gathered logits and each position's (M, S, A) of target row i and draft row i.

    A token outside [0, V) has p = q = 0 (so it is rejected) and the sequence is flagged (`_any_bad`), the
    input contract's TOKEN_OUT_OF_RANGE (sdbench.ops.input_contract), as in prob_verify's kernels."""
    positions = tl.arange(0, GAMMA_PAD)
    in_draft = positions < GAMMA
    in_vocab = (tokens >= 0) & (tokens < vocab)
    p = _probability(target_logit, inverse_t, max_t, sum_t, greedy_t, tokens == arg_t, PRECISE_MATH)
    q = _probability(draft_logit, inverse_d, max_d, sum_d, greedy_d, tokens == arg_d, PRECISE_MATH)
    p = tl.where(in_vocab, p, 0.0)
    q = tl.where(in_vocab, q, 0.0)
    return p, q, in_draft & ~in_vocab


@triton.jit
def _any_bad(out_of_vocab):
    """1 where a draft token of the sequence is outside [0, V), else 0 (reduced last: off the scan's path)."""
    return tl.max(out_of_vocab.to(tl.int32), axis=0)


@triton.jit
def _accept_scan(tokens, target_logit, draft_logit, uniforms_ptr, b, vocab, row_max, row_sum, row_arg,
                 inverse_t, inverse_d, greedy_t, greedy_d, seed, offset, stride_u_b,
                 GAMMA: tl.constexpr, GAMMA_PAD: tl.constexpr, R_PAD: tl.constexpr,
                 PRECISE_MATH: tl.constexpr, FAST: tl.constexpr):
    """(k, bad): k is the first position i with !(u_i·q_i(x_i) < p_i(x_i)) (`_draft_token_logits`' tokens
    and logits; the rows' stats as [R_PAD] vectors)."""
    p, q, out_of_vocab = _draft_token_probs(tokens, target_logit, draft_logit, vocab, row_max, row_sum, row_arg,
                                            inverse_t, inverse_d, greedy_t, greedy_d, GAMMA, GAMMA_PAD, R_PAD,
                                            PRECISE_MATH)
    return _first_rejection(p, q, out_of_vocab, uniforms_ptr, b, greedy_t, seed, offset, stride_u_b, GAMMA, GAMMA_PAD,
                            FAST)


@triton.jit
def _accept_scan_at_positions(tokens, target_logit, draft_logit, uniforms_ptr, b, vocab, max_t, sum_t, arg_t, max_d,
                              sum_d, arg_d, inverse_t, inverse_d, greedy_t, greedy_d, seed, offset, stride_u_b,
                              GAMMA: tl.constexpr, GAMMA_PAD: tl.constexpr, PRECISE_MATH: tl.constexpr,
                              FAST: tl.constexpr):
    """`_accept_scan` from `_position_stats`' per-position vectors: no picks."""
    p, q, out_of_vocab = _token_probs(tokens, target_logit, draft_logit, vocab, max_t, sum_t, arg_t, max_d, sum_d,
                                      arg_d, inverse_t, inverse_d, greedy_t, greedy_d, GAMMA, GAMMA_PAD, PRECISE_MATH)
    return _first_rejection(p, q, out_of_vocab, uniforms_ptr, b, greedy_t, seed, offset, stride_u_b, GAMMA, GAMMA_PAD,
                            FAST)


@triton.jit
def _first_rejection(p, q, out_of_vocab, uniforms_ptr, b, greedy_t, seed, offset, stride_u_b,
                     GAMMA: tl.constexpr, GAMMA_PAD: tl.constexpr, FAST: tl.constexpr):
    """(k, bad) from each position's p_i(x_i), q_i(x_i) and bad-id flag."""
    positions = tl.arange(0, GAMMA_PAD)
    in_draft = positions < GAMMA
    u = _accept_uniforms(uniforms_ptr, b, positions, in_draft, stride_u_b, seed, offset, FAST)
    # q := 0 for a greedy target, as reference.prob_verify_logits defines it (x_i accepted iff p = 1): its draft rows'
    # stats, which pass 1 may have skipped (SKIP_GREEDY_DRAFTS), are never used
    q = tl.where(greedy_t, 0.0, q)
    rejected = in_draft & ~(u * q < p)
    # k and the bad-id flag in one reduction
    k, bad = tl.reduce((tl.where(rejected, positions, GAMMA), out_of_vocab.to(tl.int32)), 0, _min_max)
    return k, bad


# --- block verification (RULE="block"): weights, residual masses, the stop --------------------------
@triton.jit
def _block_weights(p, q, GAMMA: tl.constexpr, GAMMA_PAD: tl.constexpr):
    """[GAMMA_PAD]: position j holds w_{j+1} = min(1, w_j · p_j(x_j) / q_j(x_j)) (w_0 = 1), with p/q := +inf
    where q = 0 < p, 0 where both are 0, and a NaN product (0 · inf) := 0: reference.block_stop's float32
    arithmetic, step by step (an IEEE division and one rounding per step, so the weights are bit-exact)."""
    positive_q = q > 0
    ratio = tl.where(positive_q, tl.math.div_rn(p, tl.where(positive_q, q, 1.0)),
                     tl.where(p > 0, float("inf"), 0.0))
    positions = tl.arange(0, GAMMA_PAD)
    weights = tl.zeros([GAMMA_PAD], tl.float32)
    weight = tl.full([], 1.0, tl.float32)
    for j in tl.static_range(GAMMA):  # a clamped product is no associative scan: γ dependent steps
        product = weight * _pick(ratio, j, GAMMA_PAD)
        weight = tl.where(product > 1.0, 1.0, tl.where(product == product, product, 0.0))
        weights = tl.where(positions == j, weight, weights)
    return weights


@triton.jit
def _block_scan(tokens, target_logit, draft_logit, uniforms_ptr, mass_ptr, b, vocab, mass_splits,
                row_max, row_sum, row_arg, inverse_t, inverse_d, greedy_t, greedy_d, seed, offset, stride_u_b,
                GAMMA: tl.constexpr, GAMMA_PAD: tl.constexpr, R_PAD: tl.constexpr, MASS_PAD: tl.constexpr,
                PRECISE_MATH: tl.constexpr, FAST: tl.constexpr):
    """(τ, bad, w_τ): block verification's stop (reference.block_stop), from `_draft_token_logits`' tokens and
    logits.

    r_i (i = 1..γ-1) is the fixed-order sum of the mass_splits partials `_block_mass_kernel` left at
    mass_ptr[(b·(γ-1) + i-1)·mass_splits + s]; h_i = r_i / (r_i + (1 - w_i)) (1 where that is 0/0),
    h_γ = w_γ; τ = the largest i with η_i < h_i (η_i = the accept uniform of position i-1), else 0."""
    p, q, out_of_vocab = _draft_token_probs(tokens, target_logit, draft_logit, vocab, row_max, row_sum, row_arg,
                                            inverse_t, inverse_d, greedy_t, greedy_d, GAMMA, GAMMA_PAD, R_PAD,
                                            PRECISE_MATH)
    weights = _block_weights(p, q, GAMMA, GAMMA_PAD)
    positions = tl.arange(0, GAMMA_PAD)
    parts = tl.arange(0, MASS_PAD)[None, :]
    has_mass = positions < GAMMA - 1  # position j carries r_{j+1}; h_γ needs none
    index = (b * (GAMMA - 1) + positions[:, None]) * mass_splits + parts
    partials = tl.load(mass_ptr + index, mask=has_mass[:, None] & (parts < mass_splits), other=0.0)
    mass = tl.sum(partials, axis=1)
    denominator = mass + (1.0 - weights)
    h = tl.where(denominator > 0, tl.math.div_rn(mass, tl.where(denominator > 0, denominator, 1.0)), 1.0)
    h = tl.where(has_mass, h, weights)
    in_draft = positions < GAMMA
    eta = _accept_uniforms(uniforms_ptr, b, positions, in_draft, stride_u_b, seed, offset, FAST)
    stop = tl.max(tl.where(in_draft & (eta < h), positions + 1, 0), axis=0)
    stop_weight = tl.where(stop > 0, _pick(weights, stop - 1, GAMMA_PAD), 1.0)
    return stop, _any_bad(out_of_vocab), stop_weight


@triton.jit
def _block_mass_kernel(
    draft_tokens_ptr, target_ptr, draft_ptr, target_temp_ptr, draft_temp_ptr,
    stats_max_ptr, stats_sum_ptr, stats_arg_ptr, mass_ptr,
    vocab, splits, span, mass_splits, stride_tok_b, stride_p_b, stride_p_row, stride_q_b, stride_q_row,
    GAMMA: tl.constexpr, GAMMA_PAD: tl.constexpr, R_PAD: tl.constexpr, SPLITS_PAD: tl.constexpr,
    TILE: tl.constexpr, PRECISE_MATH: tl.constexpr,
):
    """Block rule, pass 2. Grid (B·(γ-1), mass_splits). Program (row, s), b = row // (γ-1), i = row %
    (γ-1) + 1: its partial of r_i = Σ_x max(0, w_i·p_i(x) - q_i(x)) over columns [s·span, min((s+1)·span,
    V)) of target row i and draft row i, TILE at a time, into mass[row·mass_splits + s]. w_i needs the
    normalisers of rows 0..i-1 and p_i needs row i's: pass 1's row stats (L2), so this is the second
    and last full read of the logits the rule needs. The race keys are not computed here (they would
    cost a Philox draw and a division per column of γ-1 rows): pass 3 races at τ only.
    A greedy target row needs no mass and reads nothing: there p ∈ {0, 1} and q <= 1, so every weight is
    0 or 1, and h_i is 1 where w_i = 1 (r_i / (r_i + 0), or 0/0 := 1) and 0 where w_i = 0, whatever r_i is.
    The mass is a sum, whose last bits already depend on the order: one fast exp and one multiply per
    logit (near-ties of η_i against h_i are the reference's float32-rounding tolerance).
    Registers: one TILE of target and one of draft logits (16 + 16 per thread at 4 warps)."""
    row = tl.program_id(0)
    # splits in reverse: pass 1 dispatched split 0 of every row first, so the columns it streamed last are
    # the ones still in L2 when this pass's first wave starts (predicted to save part of a 50 MB L2's worth)
    split = mass_splits - 1 - tl.program_id(1)
    b = (row // (GAMMA - 1)).to(tl.int64)
    i = row % (GAMMA - 1) + 1
    temperature_t, temperature_d = tl.load(target_temp_ptr + b), tl.load(draft_temp_ptr + b)
    greedy_t, greedy_d = temperature_t == 0, temperature_d == 0
    inverse_t, inverse_d = _inverse_temperature(temperature_t), _inverse_temperature(temperature_d)
    row_max, row_sum, row_arg = _combined_stats(stats_max_ptr, stats_sum_ptr, stats_arg_ptr, b, splits,
                                                GAMMA, R_PAD, SPLITS_PAD, "")
    tokens, target_logit, draft_logit = _draft_token_logits(draft_tokens_ptr, target_ptr, draft_ptr, b, vocab,
                                                            stride_tok_b, stride_p_b, stride_p_row, stride_q_b,
                                                            stride_q_row, GAMMA, GAMMA_PAD)
    p_at, q_at, _ = _draft_token_probs(tokens, target_logit, draft_logit, vocab, row_max, row_sum, row_arg,
                                       inverse_t, inverse_d, greedy_t, greedy_d, GAMMA, GAMMA_PAD, R_PAD, PRECISE_MATH)
    weight = _pick(_block_weights(p_at, q_at, GAMMA, GAMMA_PAD), i - 1, GAMMA_PAD)
    max_t, sum_t, _, max_d, sum_d, arg_d = _pick_stop_stats(row_max, row_sum, row_arg, i, i + GAMMA + 1, R_PAD)
    target_row = target_ptr + b * stride_p_b + i * stride_p_row
    draft_row = draft_ptr + b * stride_q_b + i * stride_q_row
    start = split * span
    end = tl.minimum(start + span, vocab)
    mass = tl.zeros([TILE], tl.float32)  # a partial per lane, reduced once at the end of the span
    if temperature_t != 0:  # see above: a greedy target row keeps r_i = 0
        target_scale = weight / sum_t  # w·p = w/S_t · exp(z - M_t): one multiply per logit
        draft_scale = 1.0 / sum_d
        for tile_start in range(start, end, TILE):
            cols = tile_start + tl.arange(0, TILE)
            inside = cols < end
            z_t = tl.load(target_row + cols, mask=inside, other=float("-inf")).to(tl.float32) * inverse_t
            z_d = tl.load(draft_row + cols, mask=inside, other=float("-inf")).to(tl.float32) * inverse_d
            q = tl.exp(z_d - max_d) * draft_scale
            q = tl.where(greedy_d, tl.where(cols == arg_d, 1.0, 0.0), q)
            residual = target_scale * tl.exp(z_t - max_t) - q
            mass += tl.where(inside & (residual > 0), residual, 0.0)
    tl.store(mass_ptr + row * mass_splits + split, tl.sum(mass, axis=0))


@triton.jit
def _row_logits(target_row, draft_row, cols, vocab, has_draft, greedy_d):
    """The raw target and draft logits at cols of row k (-inf where masked). No draft row is read at the
    bonus row, nor for a greedy draft, whose q is one-hot at its argmax (`_residual_of`)."""
    z_t = tl.load(target_row + cols, mask=cols < vocab, other=float("-inf"))
    z_d = tl.load(draft_row + cols, mask=cols < tl.where(has_draft & (greedy_d == 0), vocab, 0), other=float("-inf"))
    return z_t, z_d


@triton.jit
def _exponent_bias(row_max, row_sum):
    """log2(e)·M + log2(S): 2^(z·log2(e)/T - this) = exp(z/T - M) / S. +inf for a row with S = 0 (every
    logit -inf, or a row not read), so its terms are 2^-inf = 0, never -inf + inf = NaN."""
    return tl.where(row_sum > 0, row_max * LOG2E + tl.log2(row_sum), float("inf"))


@triton.jit
def _residual_of(z_t, z_d, cols, vocab, has_draft, inverse_t, inverse_d, greedy_d, max_t, sum_t, max_d, sum_d, arg_d,
                 target_scale, PRECISE_MATH: tl.constexpr, FAST: tl.constexpr, SCALED: tl.constexpr):
    """w = p - q from row k's raw logits at cols (`_row_logits`; q := 0 at the bonus row): positive where
    the residual is. Supplied randomness computes p and q as the reference does (IEEE division, the
    precise exp). Fast mode, whose draws are exact in distribution and never compared bit for bit, folds
    1/T, the max and the sum into one exponent, p = 2^(z·c - b) with c = log2(e)/T and b = log2(e)·M +
    log2(S), so a logit costs an FMA and the bare MUFU.EX2 (`_exp2`): the race reads two logits for one
    output and was issue-bound at ~18 instructions a logit (H200, bf16: 3.2 TB/s). The exponent's
    rounding is what the old z/T - M had (a relative few 1e-6 in p and q). Elementwise: a column's w is
    the same float whatever the shape of cols (`_cdf_pick` recomputes the race's chunks: the FMAs are
    explicit, so no call site may contract or not contract them differently). SCALED (the block rule):
    w = target_scale·p - q, target_scale = w_τ below γ and 1 at the bonus row."""
    if FAST:
        p = _exp2(tl.fma(z_t.to(tl.float32), inverse_t * LOG2E, -_exponent_bias(max_t, sum_t)), NATIVE)
        q = _exp2(tl.fma(z_d.to(tl.float32), inverse_d * LOG2E, -_exponent_bias(max_d, sum_d)), NATIVE)
        # a greedy draft's q is one-hot at its argmax (its logits were not loaded: 2^-inf = 0 elsewhere)
        q = tl.where(cols == tl.where(greedy_d & has_draft, arg_d, -1), 1.0, q)
        if SCALED:
            return tl.fma(p, target_scale, -q)
        else:
            return p - q
    else:
        p = tl.math.div_rn(_exp(z_t.to(tl.float32) * inverse_t - max_t, PRECISE_MATH), sum_t)
        if SCALED:
            p = target_scale * p
        q = tl.math.div_rn(_exp(z_d.to(tl.float32) * inverse_d - max_d, PRECISE_MATH), sum_d)
        q = tl.where(greedy_d, tl.where(cols == arg_d, 1.0, 0.0), q)
        return p - tl.where(cols < tl.where(has_draft, vocab, 0), q, 0.0)


@triton.jit
def _row_residual(target_row, draft_row, cols, vocab, has_draft, inverse_t, inverse_d, greedy_d,
                  max_t, sum_t, max_d, sum_d, arg_d, target_scale, PRECISE_MATH: tl.constexpr, FAST: tl.constexpr,
                  SCALED: tl.constexpr):
    """`_residual_of` at cols of row k, loaded here."""
    z_t, z_d = _row_logits(target_row, draft_row, cols, vocab, has_draft, greedy_d)
    return _residual_of(z_t, z_d, cols, vocab, has_draft, inverse_t, inverse_d, greedy_d, max_t, sum_t, max_d, sum_d,
                        arg_d, target_scale, PRECISE_MATH, FAST, SCALED)


@triton.jit
def _row_keys(target_row, draft_row, noise, cols, vocab, has_draft, inverse_t, inverse_d, greedy_d,
              max_t, sum_t, max_d, sum_d, arg_d, target_scale, PRECISE_MATH: tl.constexpr, FAST: tl.constexpr,
              SCALED: tl.constexpr):
    """Packed race keys w/E at cols of row k (`_row_residual`); -1 where w <= 0."""
    residual = _row_residual(target_row, draft_row, cols, vocab, has_draft, inverse_t, inverse_d, greedy_d,
                             max_t, sum_t, max_d, sum_d, arg_d, target_scale, PRECISE_MATH, FAST, SCALED)
    if FAST:
        key = residual / noise
    else:
        key = tl.math.div_rn(residual, noise)  # IEEE, as PyTorch's w / E
    return _pack(tl.where(residual > 0, key, -1.0), cols)


def default_picks(rule: str, race: RacePlan) -> bool:
    """Fast mode's default draw: "picks" (`_pick_in_chunk`, `_chunk_choice`) where each race program takes one chunk,
    else "cdf" (`_cdf_pick`). Measured on the H200 (docs/perf-notes.md, "Session 39"), token rule, b = 32, V = 32000,
    one chunk a program: picks moves the draw's second level off the last arrival's path (its draw 1.75 -> 0.5 µs)
    into the programs (their chunk work +0.5 µs, run side by side) and took 0.7-1.4 µs off the total at all ten
    point-states; with several chunks a program each pays that for every chunk, and it lost 2.5-2.7 µs (b = 128).
    The H100 has the same SMs and L2 (GH100) and was not lent to measure it. The block rule was not measured: it
    keeps "cdf"."""
    return rule == "token" and race.steps == 1


@triton.jit
def _cdf_uniform(seed, b, offset, counter):
    """Fast mode's 53-bit uniform in [0, 1) (two Philox words) on the inversion's stream, keyed by (b, offset) and a
    counter (0: the chunk's choice, `_chunk_by_mass`)."""
    zero = tl.zeros([1], tl.uint32)
    r0, r1, _, _ = tl.philox(seed, zero + counter.to(tl.uint32), zero + b.to(tl.uint32), zero + offset.to(tl.uint32),
                             zero + STREAM_CDF)
    return tl.sum((r0.to(tl.float64) + r1.to(tl.float64) * 2.3283064365386963e-10) * 2.3283064365386963e-10, axis=0)


@triton.jit
def _pick_in_chunk(w, chunk, b, seed, offset, CHUNK: tl.constexpr, VEC: tl.constexpr, GROUP: tl.constexpr,
                   PRECISE_MATH: tl.constexpr):
    """sample "picks": a race program's candidate column in its chunk `chunk` of CHUNK columns, whose max(w, 0) it
    holds in registers (w: [lanes, VEC], lanes of VEC adjacent columns), with no running sum across threads. A unit
    is GROUP lanes, l, l + lanes / GROUP, ...: the lanes one thread holds where Triton lays lanes over the threads
    and then repeats (so nothing below leaves the thread but the race). Each unit makes one Philox call (counter: the
    unit's index in the row, stream STREAM_PICK) and draws
    - a column within the unit by inversion inside the thread, on its float32 running sum in (lane, column) order
      and a 24-bit uniform u: the first column with w > 0 whose running sum exceeds u·s, or the unit's last column
      with w > 0 where none does. The running sum is built so that it never falls (each lane's in-thread scan
      carries exactly the previous lane's last value; s is its last value and u <= 1 - 2^-23, so u·s < s and the
      first column past u·s is one where the sum rose: w > 0). The two w > 0 tests still matter where Triton spreads
      a lane over threads (a vocab or stride it does not know to be a multiple of 16): its scan then adds in another
      order and can fall by an ulp, and a count of sums <= u·s could land on a dead column. w_x / s up to float32
      rounding: a few ulps of s per column, absolute (cdf's float64 draw is relative to every column's own w; the w
      themselves carry 2^-24 of p + q);
    - the unit, by an exponential race over the units (key s / E): s / Σ_c w, relative rounding only.
    The race's max and the chunk's mass are one tuple reduction. Returns (the chunk's mass m_c, float32, the sum of
    its units' sums; the candidate, or -1 where the chunk has no w > 0). With `_chunk_choice` picking chunk c with
    probability m_c / M, a column is drawn with probability (m_c / M)·(s / Σ_c w)·(w_x / s). A candidate that scanned
    the whole chunk in float64 cost each program ~1.25 µs, and one with a float64 sum a lane ~1.0 (H200); this one
    ~0.5 (docs/perf-notes.md, "Session 39")."""
    UNITS: tl.constexpr = CHUNK // VEC // GROUP
    w = tl.reshape(w, [GROUP, UNITS, VEC])
    unit = tl.arange(0, UNITS)
    group = tl.arange(0, GROUP)
    in_lane = tl.cumsum(w, axis=2)
    lane_last = tl.max(in_lane, axis=2)  # [GROUP, UNITS]: the lane's running sum at its end (it never falls)
    # each lane starts from the previous lanes' running sum, exactly: the scan of the last values shifted by one
    shifted = tl.sum(tl.where(group[None, :, None] == group[:, None, None] + 1, lane_last[:, None, :], 0.0), axis=0)
    carried = tl.cumsum(shifted, axis=0)
    running = in_lane + carried[:, :, None]
    total = tl.sum(tl.where(group[:, None] == GROUP - 1, lane_last + carried, 0.0), axis=0)  # = the last running sum
    zero = tl.zeros([UNITS], tl.uint32)
    r0, r1, _, _ = tl.philox(seed, (chunk * UNITS + unit).to(tl.uint32), zero + b.to(tl.uint32),
                             zero + offset.to(tl.uint32), zero + STREAM_PICK)
    threshold = tl.minimum(tl.uint_to_uniform_float(r0), 0.99999988079071045) * total  # u <= 1 - 2^-23
    position = group[:, None, None] * VEC + tl.arange(0, VEC)[None, None, :]  # in the unit, (lane, column) order
    live = w > 0
    first = tl.min(tl.min(tl.where((running > threshold[None, :, None]) & live, position, GROUP * VEC), axis=2),
                   axis=0)
    last = tl.max(tl.max(tl.where(live, position, -1), axis=2), axis=0)  # >= 0 wherever total > 0
    index = tl.where(first < GROUP * VEC, first, last)  # (-1: no w > 0, total = 0, key -1: the unit never wins)
    column = ((index // VEC) * UNITS + unit) * VEC + index % VEC
    key = tl.where(total > 0, _fast_divide(total, _exponential(tl.uint_to_uniform_float(r1), PRECISE_MATH),
                                           PRECISE_MATH), -1.0)
    chunk_mass, best = tl.reduce((total, _pack(key, chunk * CHUNK + column)), 0, _sum_max)
    return chunk_mass, tl.where(best >= 0, _token_of(best), -1)


@triton.jit
def _chunk_by_mass(chunk_mass_ptr, b, chunks, seed, offset, CHUNKS_PAD: tl.constexpr):
    """The inversion's first level, on one 53-bit uniform u (counter 0): the chunk c whose float64 cumulative mass
    first exceeds u·M (M = Σ of the `chunks` float32 chunk masses m_c at chunk_mass_ptr, written by the race
    programs). Returns (c, u·M - Σ_{c' < c} m_c', m_c, whether M > 0); c is 0 when M = 0, so that a caller's
    reads stay inside the row (its result is then unused). M > 0 is tested as well as a positive mass, so that a NaN
    mass (NaN logits) sends the caller to the target's own draw, as before this helper."""
    index = tl.arange(0, CHUNKS_PAD)
    mass = tl.load(chunk_mass_ptr + b * chunks + index, mask=index < chunks, other=0.0,
                   cache_modifier=".cg").to(tl.float64)
    cumulative = tl.cumsum(mass, axis=0)
    total = tl.sum(mass, axis=0)
    threshold = _cdf_uniform(seed, b, offset, tl.zeros([], tl.int32)) * total
    last = tl.max(tl.where(mass > 0, index, -1), axis=0)
    chunk = tl.maximum(tl.minimum(tl.sum((cumulative <= threshold).to(tl.int32), axis=0), last), 0)
    chunk_mass = tl.sum(tl.where(index == chunk, mass, 0.0), axis=0)
    before = tl.sum(tl.where(index == chunk, cumulative, 0.0), axis=0) - chunk_mass
    return chunk, threshold - before, chunk_mass, (total > 0) & (last >= 0)


@triton.jit
def _chunk_choice(chunk_mass_ptr, chunk_pick_ptr, b, chunks, seed, offset, CHUNKS_PAD: tl.constexpr):
    """sample "picks", the last arrival: the chunk `_chunk_by_mass` chooses (as `_cdf_pick` chooses it), and the
    candidate c's program stored (`_pick_in_chunk`): no chunk read again. -1 when M = 0."""
    index = tl.arange(0, CHUNKS_PAD)  # every candidate loads beside the masses, not after the choice
    picks = tl.load(chunk_pick_ptr + b * chunks + index, mask=index < chunks, other=-1, cache_modifier=".cg")
    chunk, _, _, any_mass = _chunk_by_mass(chunk_mass_ptr, b, chunks, seed, offset, CHUNKS_PAD)
    return tl.where(any_mass, tl.sum(tl.where(index == chunk, picks, 0), axis=0), -1)


@triton.jit
def _cdf_pick(chunk_mass_ptr, target_row, draft_row, b, vocab, chunks, has_draft, inverse_t, inverse_d, greedy_d,
              max_t, sum_t, max_d, sum_d, arg_d, target_scale, seed, offset,
              CHUNK: tl.constexpr, CHUNKS_PAD: tl.constexpr, SCALED: tl.constexpr):
    """Fast mode's residual draw by inversion, two levels, with one 53-bit uniform u (two Philox words):
    the chunk c by its mass (`_chunk_by_mass`), then, within c's CHUNK columns (computed again: the same
    floats), the first column whose float64 cumulative w exceeds the same fraction of c's own float64 sum.
    A column is drawn with probability (m_c / M)·(w_x / Σ_c w): w_x / M up to the float32 rounding of m_c
    (a relative ~1e-7, as the race's w/E keys have), so no column's probability is quantised by u's or a
    running sum's resolution. m_c is the chunk's tl.sum, so the draw depends on the race plan's chunking
    through that rounding only. Returns the column, or -1 when M = 0."""
    chunk, remainder, chunk_mass, any_mass = _chunk_by_mass(chunk_mass_ptr, b, chunks, seed, offset, CHUNKS_PAD)
    # >= 0: `remainder` may round an ulp below 0; 0 then takes the chunk's first positive column
    fraction = tl.maximum(remainder / tl.where(chunk_mass > 0, chunk_mass, 1.0), 0.0)
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    w = _row_residual(target_row, draft_row, cols, vocab, has_draft, inverse_t, inverse_d, greedy_d,
                      max_t, sum_t, max_d, sum_d, arg_d, target_scale, True, True, SCALED)
    w = tl.maximum(w, 0.0).to(tl.float64)  # (the race's chunk masses sum the same max(w, 0))
    within = tl.cumsum(w, axis=0)
    # the fraction of c's own sum, so the two levels agree however the chunk's floats were grouped
    below = tl.sum((within <= fraction * tl.sum(w, axis=0)).to(tl.int32), axis=0)
    last_col = tl.max(tl.where(w > 0, tl.arange(0, CHUNK), -1), axis=0)
    pick = chunk * CHUNK + tl.minimum(below, last_col)
    # last_col < 0 only if the recomputed chunk disagreed with its stored mass (it cannot: the same floats);
    # never return a column outside the chunk: -1 sends the caller to the target's own draw
    return tl.where(any_mass & (last_col >= 0), pick, -1)


@triton.jit
def _target_race(target_row, noise_row, b, vocab, inverse_t, max_t, sum_t, seed, offset,
                 ROWS: tl.constexpr, PRECISE_MATH: tl.constexpr, FAST: tl.constexpr):
    """argmax_j p_j / E_j over the whole target row k (packed): the race when w is 0 everywhere."""
    best = tl.full([ROWS, 4], -1, tl.int64)
    for start in range(0, vocab, 4 * ROWS):
        cols = _chunk_columns(start, ROWS)
        noise = _race_noise(noise_row, b, start, cols, vocab, seed, offset, ROWS, PRECISE_MATH, FAST)
        z = tl.load(target_row + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32) * inverse_t
        p = tl.math.div_rn(_exp(z - max_t, PRECISE_MATH), sum_t)
        best = tl.maximum(best, _pack(tl.math.div_rn(p, noise), cols))
    return tl.max(tl.max(best, axis=1), axis=0)


@triton.jit
def _write_row(output_tokens_ptr, next_tokens_ptr, accepted_lengths_ptr, b, k, tokens, next_token, stride_out_b,
               GAMMA: tl.constexpr, GAMMA_PAD: tl.constexpr):
    positions = tl.arange(0, GAMMA_PAD)
    out_row = output_tokens_ptr + b * stride_out_b
    out_type = output_tokens_ptr.dtype.element_ty
    drafts = tl.where(positions < k, tokens, tl.where(positions == k, next_token, -1))
    tl.store(out_row + positions, drafts.to(out_type), mask=positions < GAMMA)
    tl.store(out_row + GAMMA, tl.where(k < GAMMA, -1, next_token).to(out_type))
    tl.store(next_tokens_ptr + b, next_token.to(next_tokens_ptr.dtype.element_ty))
    tl.store(accepted_lengths_ptr + b, k.to(tl.int64))


@triton.jit
def _philox_offset(offsets_ptr, b, FAST: tl.constexpr):
    """Fast mode's Philox offset of sequence b, kept on the device (0 when randomness is supplied)."""
    if FAST:
        offset = tl.load(offsets_ptr + b)
    else:
        offset = tl.zeros((), tl.int64)
    return offset


# --- the accept scan as a kernel of its own (fused_logits scan="kernel"; vllm_v2_style) -----------
@triton.jit(do_not_specialize=["seed"])
def _scan_kernel(
    draft_tokens_ptr, target_ptr, draft_ptr, target_temp_ptr, draft_temp_ptr, uniforms_ptr,
    stats_max_ptr, stats_sum_ptr, stats_arg_ptr, stop_ptr, stop_stats_ptr, offsets_ptr, error_flags_ptr,
    seed, splits, vocab,
    stride_tok_b, stride_p_b, stride_p_row, stride_q_b, stride_q_row, stride_u_b,
    GAMMA: tl.constexpr, GAMMA_PAD: tl.constexpr, R_PAD: tl.constexpr, SPLITS_PAD: tl.constexpr,
    PRECISE_MATH: tl.constexpr, FAST: tl.constexpr, FLAGS: tl.constexpr, PDL: tl.constexpr,
    LEAN_SCAN: tl.constexpr,
):
    """Grid (B,): combine pass 1's `splits` partials of each of the sequence's 2γ+1 rows, scan to k, and
    write k (stop_ptr, int32 [B]) and row k's normalisers (stop_stats_ptr, float32 [B, 6]: M_t, S_t, M_q,
    S_q, then the target's and the draft's first argmax as int32 bits), so the programs after it load one
    sequence's stop in one L2 round trip. FLAGS: the sequence's bad-id flag too (fused_logits; the peer
    has none). Reads fast mode's Philox offset without advancing it: the launch after it draws from the
    same offset and advances it (stream order), so both see the same accept uniforms.
    PDL (launched with launch_pdl after pass 1): it lets the race start its programs at once
    (`_let_next_kernel_start`); its inputs (the offset, temperatures, tokens and their logits) load while pass 1
    finishes, the partials after `_wait_for_prior_kernel`."""
    _let_next_kernel_start(PDL)
    b = tl.program_id(0).to(tl.int64)
    offset = _philox_offset(offsets_ptr, b, FAST)
    temperature_t, temperature_d = tl.load(target_temp_ptr + b), tl.load(draft_temp_ptr + b)
    tokens, target_logit, draft_logit = _draft_token_logits(draft_tokens_ptr, target_ptr, draft_ptr, b, vocab,
                                                            stride_tok_b, stride_p_b, stride_p_row, stride_q_b,
                                                            stride_q_row, GAMMA, GAMMA_PAD)
    _wait_for_prior_kernel(PDL)
    if LEAN_SCAN:  # only the rows it reads, each combined alone (as the race that scans: `_position_stats`)
        (pos_max_t, pos_sum_t, pos_arg_t, pos_max_d, pos_sum_d, pos_arg_d, bonus_max, bonus_sum,
         bonus_arg) = _position_stats(stats_max_ptr, stats_sum_ptr, stats_arg_ptr, b, splits, GAMMA, GAMMA_PAD,
                                      SPLITS_PAD, "")
        k, bad = _accept_scan_at_positions(tokens, target_logit, draft_logit, uniforms_ptr, b, vocab, pos_max_t,
                                           pos_sum_t, pos_arg_t, pos_max_d, pos_sum_d, pos_arg_d,
                                           _inverse_temperature(temperature_t), _inverse_temperature(temperature_d),
                                           temperature_t == 0, temperature_d == 0, seed, offset, stride_u_b,
                                           GAMMA, GAMMA_PAD, PRECISE_MATH, FAST)
        max_t, sum_t, arg_t, max_d, sum_d, arg_d = _pick_position_stats(
            pos_max_t, pos_sum_t, pos_arg_t, pos_max_d, pos_sum_d, pos_arg_d, bonus_max, bonus_sum, bonus_arg, k,
            GAMMA, GAMMA_PAD)
    else:
        row_max, row_sum, row_arg = _combined_stats(stats_max_ptr, stats_sum_ptr, stats_arg_ptr, b, splits,
                                                    GAMMA, R_PAD, SPLITS_PAD, "")
        k, bad = _accept_scan(tokens, target_logit, draft_logit, uniforms_ptr, b, vocab, row_max, row_sum, row_arg,
                              _inverse_temperature(temperature_t), _inverse_temperature(temperature_d),
                              temperature_t == 0, temperature_d == 0, seed, offset, stride_u_b,
                              GAMMA, GAMMA_PAD, R_PAD, PRECISE_MATH, FAST)
        draft_k = tl.minimum(k, GAMMA - 1) + GAMMA + 1
        max_t, sum_t, arg_t, max_d, sum_d, arg_d = _pick_stop_stats(row_max, row_sum, row_arg, k, draft_k, R_PAD)
    tl.store(stop_ptr + b, k)
    out = stop_stats_ptr + b * 6
    tl.store(out + 0, max_t)
    tl.store(out + 1, sum_t)
    tl.store(out + 2, max_d)
    tl.store(out + 3, sum_d)
    tl.store(out + 4, arg_t.to(tl.float32, bitcast=True))
    tl.store(out + 5, arg_d.to(tl.float32, bitcast=True))
    if FLAGS:
        tl.store(error_flags_ptr + b, bad * TOKEN_OUT_OF_RANGE)


# --- the race pass (fused_logits): scan + split race + atomic combine ---------------------------
@triton.jit
def _race_program(
    b, chunk, draft_tokens_ptr, target_ptr, draft_ptr, target_temp_ptr, draft_temp_ptr, uniforms_ptr, noise_ptr,
    stats_max_ptr, stats_sum_ptr, stats_arg_ptr, mass_ptr, stop_ptr, stop_stats_ptr,
    accepted_lengths_ptr, next_tokens_ptr, output_tokens_ptr, error_flags_ptr, best_ptr, arrivals_ptr, offsets_ptr,
    chunk_mass_ptr, chunk_pick_ptr, timeline_ptr, done_ptr, seed, vocab, mass_splits, chunks, stats_splits,
    pass_programs, stride_tok_b, stride_p_b, stride_p_row, stride_q_b, stride_q_row, stride_u_b, stride_e_b,
    stride_out_b,
    GAMMA: tl.constexpr, GAMMA_PAD: tl.constexpr, R_PAD: tl.constexpr,
    MASS_PAD: tl.constexpr, ROWS: tl.constexpr, STEPS: tl.constexpr, PRECISE_MATH: tl.constexpr,
    FAST: tl.constexpr, RULE: tl.constexpr, SCANNED: tl.constexpr, CDF: tl.constexpr, CHUNKS_PAD: tl.constexpr,
    STATS_PAD: tl.constexpr, STOP_STATS: tl.constexpr, VEC: tl.constexpr, STATS_CACHE: tl.constexpr,
    TIMELINE: tl.constexpr, PDL: tl.constexpr, TOKENS_FIRST: tl.constexpr, LEAN_SCAN: tl.constexpr,
    PICKS: tl.constexpr, SEQUENCE_WAIT: tl.constexpr,
):
    """The race's program (b, c), grid (B, chunks) in `_logits_race_kernel`; returns whether it arrived last.
    It owns STEPS chunks of 4·ROWS columns of the stopping row, columns
    [c·STEPS·4·ROWS, (c+1)·STEPS·4·ROWS): at large B, where the chunks alone would fill the machine many
    times over, more chunks per program pay the stop's loads once for all of them. `chunks` is the number
    of programs per row (the arrivals to wait for). stats_*_ptr hold one (max, Σexp, argmax) per logits row.
    best_ptr (int64 [B]) and arrivals_ptr (int32 [B]) start zeroed and are left zeroed.
    RULE "token": the stop is the first rejection k. SCANNED (token rule; fused_logits_launcher's `scan`,
    "pass1" or "kernel"): an earlier kernel ran the accept scan and left k at stop_ptr and the error flag
    written, so a program loads k (one L2 round trip, beside the rows' stats) instead of gathering 2γ
    logits and scanning; otherwise every program scans (scan "race": where the race does not fill the
    machine, so the repeats run beside each other; scan "early": where it does, each program as soon as its
    sequence's pass 1 is done, SEQUENCE_WAIT). STOP_STATS (scan "kernel"): `_scan_kernel` also left
    row k's normalisers at stop_stats_ptr [B, 6], so a program loads 7 numbers and combines nothing.
    CDF (fast mode's "cdf" and "picks"): each program stores its chunks' residual masses (chunk_mass_ptr, float32,
    `chunks`·STEPS a sequence) and the last arrival draws the token by inversion (`_cdf_pick`); otherwise
    the exponential race on Philox noise (supplied mode: on the supplied noise, as the reference defines).
    PICKS (with CDF; sample "picks"; 0: off, else the lanes a thread holds, `_pick_group`): each program also
    stores a candidate column in each of its chunks (`_pick_in_chunk`, chunk_pick_ptr, int32, beside the masses),
    and the last arrival only chooses the chunk (`_chunk_choice`) instead of reading the chosen chunk again
    (`_cdf_pick`).
    RULE "block": the stop τ and w_τ from the draft-token ratios and the residual masses at mass_ptr
    (`_block_scan`, every program), and the race over max(0, w_τ·p_τ - q_τ). Constexprs: each path
    compiles only its own code.
    Fast mode draws at the Philox offset offsets_ptr[b] (int64 [B]), which the last arrival advances by one,
    as prob `fused` does: timed calls and graph replays draw fresh numbers with no host work.
    PDL (`_logits_race_kernel` launched with launch_pdl): the inputs (offset, temperatures) load before
    `_wait_for_prior_kernel`, while the kernel ahead finishes; what pass 1, the scan kernel or the mass pass wrote,
    after it (SEQUENCE_WAIT: after its sequence's pass-1 count, the kernel ahead perhaps still running).
    TOKENS_FIRST (a program that scans): the draft tokens and their 2γ logits load before the rows' stats (and, with
    PDL, before the wait), or after them (the order measured faster without PDL at b = 1).
    LEAN_SCAN (a program that scans, token rule): it combines only the rows it reads, position by position
    (`_position_stats`), not all 2γ+1 rows and then picks (`_combined_stats`; the same rows and formula, S up to its
    last bit, since each tile's layout sets the addition tree: `_rows_stats`).
    SEQUENCE_WAIT (scan "early" and the one launch; a program that scans): instead of waiting for the whole kernel
    ahead, it waits until the `pass_programs` pass-1 programs of its own sequence are done (`_wait_for_sequence` on
    done_ptr, which the last arrival resets to 0), and reads their partials with STATS_CACHE ".cg"."""
    b = b.to(tl.int64)
    mark = (b * chunks + chunk) * RACE_MARKS
    _mark(timeline_ptr, mark, chunk, TIMELINE)
    offset = _philox_offset(offsets_ptr, b, FAST)
    noise_row = noise_ptr + b * stride_e_b
    temperature_t = tl.load(target_temp_ptr + b)
    temperature_d = tl.load(draft_temp_ptr + b)
    greedy_t, greedy_d = temperature_t == 0, temperature_d == 0
    inverse_t, inverse_d = _inverse_temperature(temperature_t), _inverse_temperature(temperature_d)
    if TOKENS_FIRST and not (SCANNED or STOP_STATS):  # inputs only: with PDL they load while the kernel ahead ends
        tokens, target_logit, draft_logit = _draft_token_logits(draft_tokens_ptr, target_ptr, draft_ptr, b, vocab,
                                                                stride_tok_b, stride_p_b, stride_p_row, stride_q_b,
                                                                stride_q_row, GAMMA, GAMMA_PAD)
    if SEQUENCE_WAIT:  # (the kernel ahead may still run: its programs of later sequences)
        _wait_for_sequence(done_ptr, b, pass_programs)
    else:
        _wait_for_prior_kernel(PDL)
    if STOP_STATS:  # `_scan_kernel` left k, row k's normalisers and the flag: one L2 round trip, nothing combined
        k = tl.load(stop_ptr + b)
        stop_stats = stop_stats_ptr + b * 6
        max_t, sum_t = tl.load(stop_stats + 0), tl.load(stop_stats + 1)
        max_d, sum_d = tl.load(stop_stats + 2), tl.load(stop_stats + 3)
        arg_t = tl.load(stop_stats + 4).to(tl.int32, bitcast=True)
        arg_d = tl.load(stop_stats + 5).to(tl.int32, bitcast=True)
        target_scale = 1.0
    elif LEAN_SCAN and RULE == "token" and not SCANNED:
        # the rows the scan and row k need, each combined alone (one L2 round trip, beside the tokens' if they load
        # first): no [R_PAD] vector of every row, no [GAMMA_PAD, R_PAD] picks
        (pos_max_t, pos_sum_t, pos_arg_t, pos_max_d, pos_sum_d, pos_arg_d, bonus_max, bonus_sum,
         bonus_arg) = _position_stats(stats_max_ptr, stats_sum_ptr, stats_arg_ptr, b, stats_splits, GAMMA, GAMMA_PAD,
                                      STATS_PAD, STATS_CACHE)
        if not TOKENS_FIRST:
            tokens, target_logit, draft_logit = _draft_token_logits(
                draft_tokens_ptr, target_ptr, draft_ptr, b, vocab, stride_tok_b, stride_p_b, stride_p_row,
                stride_q_b, stride_q_row, GAMMA, GAMMA_PAD)
        k, bad = _accept_scan_at_positions(tokens, target_logit, draft_logit, uniforms_ptr, b, vocab, pos_max_t,
                                           pos_sum_t, pos_arg_t, pos_max_d, pos_sum_d, pos_arg_d, inverse_t, inverse_d,
                                           greedy_t, greedy_d, seed, offset, stride_u_b, GAMMA, GAMMA_PAD,
                                           PRECISE_MATH, FAST)
        target_scale = 1.0
        max_t, sum_t, arg_t, max_d, sum_d, arg_d = _pick_position_stats(
            pos_max_t, pos_sum_t, pos_arg_t, pos_max_d, pos_sum_d, pos_arg_d, bonus_max, bonus_sum, bonus_arg, k,
            GAMMA, GAMMA_PAD)
    else:
        # every row's stats at once, independent of the stop (one L2 round trip beside the stop's, not after it)
        # (stats_splits > 1: pass 1 left its partials uncombined, `fused_logits_launcher`'s combine=False)
        row_max, row_sum, row_arg = _combined_stats(stats_max_ptr, stats_sum_ptr, stats_arg_ptr, b, stats_splits,
                                                    GAMMA, R_PAD, STATS_PAD, STATS_CACHE)
        if SCANNED:  # token rule, pass 1 ran the scan
            k = tl.load(stop_ptr + b)
            target_scale = 1.0
        else:
            if not TOKENS_FIRST:  # (the tokens' logits after the stats' load: `_draft_token_logits`)
                tokens, target_logit, draft_logit = _draft_token_logits(
                    draft_tokens_ptr, target_ptr, draft_ptr, b, vocab, stride_tok_b, stride_p_b, stride_p_row,
                    stride_q_b, stride_q_row, GAMMA, GAMMA_PAD)
            if RULE == "block":
                k, bad, stop_weight = _block_scan(
                    tokens, target_logit, draft_logit, uniforms_ptr, mass_ptr, b, vocab, mass_splits, row_max,
                    row_sum, row_arg, inverse_t, inverse_d, greedy_t, greedy_d, seed, offset, stride_u_b,
                    GAMMA, GAMMA_PAD, R_PAD, MASS_PAD, PRECISE_MATH, FAST)
                target_scale = tl.where(k < GAMMA, stop_weight, 1.0)
            else:
                k, bad = _accept_scan(tokens, target_logit, draft_logit, uniforms_ptr, b, vocab, row_max, row_sum,
                                      row_arg, inverse_t, inverse_d, greedy_t, greedy_d, seed, offset, stride_u_b,
                                      GAMMA, GAMMA_PAD, R_PAD, PRECISE_MATH, FAST)
                target_scale = 1.0
        draft_index = tl.minimum(k, GAMMA - 1) + GAMMA + 1
        max_t, sum_t, arg_t, max_d, sum_d, arg_d = _pick_stop_stats(row_max, row_sum, row_arg, k, draft_index, R_PAD)
    _mark(timeline_ptr, mark + 1, sum_t.to(tl.int32, bitcast=True) ^ sum_d.to(tl.int32, bitcast=True) ^ k, TIMELINE)
    has_draft = k < GAMMA
    draft_k = tl.minimum(k, GAMMA - 1)
    target_row = target_ptr + b * stride_p_b + k * stride_p_row
    draft_row = draft_ptr + b * stride_q_b + draft_k * stride_q_row
    if temperature_t != 0:  # a greedy target's next token is the argmax of row k: no race, no row read
        if CDF:  # fast mode by inversion: each chunk's residual mass; the last arrival draws (`_cdf_pick`)
            # lanes of VEC adjacent columns (16 bytes: one load a lane and row); no noise, so no groups of 4
            first = chunk * STEPS
            lanes = tl.arange(0, 4 * ROWS // VEC)[:, None] * VEC + tl.arange(0, VEC)[None, :]
            cols = first * (4 * ROWS) + lanes  # past V: masked, nothing read, mass 0
            z_t, z_d = _row_logits(target_row, draft_row, cols, vocab, has_draft, greedy_d)
            for step in range(STEPS):  # the next chunk's logits load while this chunk's are summed
                next_cols = (first + tl.minimum(step + 1, STEPS - 1)) * (4 * ROWS) + lanes
                next_t, next_d = _row_logits(target_row, draft_row, next_cols, vocab, has_draft, greedy_d)
                w = _residual_of(z_t, z_d, cols, vocab, has_draft, inverse_t, inverse_d, greedy_d, max_t, sum_t,
                                 max_d, sum_d, arg_d, target_scale, True, True, RULE == "block")
                if PICKS:  # the candidate's lane race and the mass in one reduction
                    chunk_sum, pick = _pick_in_chunk(tl.maximum(w, 0.0), first + step, b, seed, offset, 4 * ROWS,
                                                     VEC, PICKS, PRECISE_MATH)
                    tl.store(chunk_pick_ptr + b * chunks * STEPS + first + step, pick)
                else:
                    chunk_sum = tl.sum(tl.maximum(w, 0.0))
                tl.store(chunk_mass_ptr + b * chunks * STEPS + first + step, chunk_sum)
                cols, z_t, z_d = next_cols, next_t, next_d
                if step == STEPS - 1:
                    _mark(timeline_ptr, mark + 2, chunk_sum.to(tl.int32, bitcast=True), TIMELINE)
        else:
            best = tl.full([ROWS, 4], -1, tl.int64)  # below every positive key; a max <= 0 means "no w > 0"
            for step in range(STEPS):
                start = (chunk * STEPS + step) * (4 * ROWS)
                cols = _chunk_columns(start, ROWS)  # past V: masked, nothing read, key -1
                noise = _race_noise(noise_row, b, start, cols, vocab, seed, offset, ROWS, PRECISE_MATH, FAST)
                # block: at τ < γ the target row is scaled by w_τ; the bonus row (τ = γ) is p_γ as it is
                keys = _row_keys(target_row, draft_row, noise, cols, vocab, has_draft, inverse_t, inverse_d,
                                 greedy_d, max_t, sum_t, max_d, sum_d, arg_d, target_scale, PRECISE_MATH, FAST,
                                 RULE == "block")
                best = tl.maximum(best, keys)
            best_key = tl.max(tl.max(best, axis=1), axis=0)
            _mark(timeline_ptr, mark + 2, best_key.to(tl.int32), TIMELINE)
            tl.atomic_max(best_ptr + b, best_key, sem="relaxed")
    arrival = tl.atomic_add(arrivals_ptr + b, 1, sem="acq_rel")
    _mark(timeline_ptr, mark + 3, arrival, TIMELINE)
    last = arrival == chunks - 1
    if TIMELINE:
        tl.store(timeline_ptr + mark + 5, _sm_id(TIMELINE).to(tl.int64))
        tl.store(timeline_ptr + mark + 6, last.to(tl.int64))
    if last:
        if greedy_t:
            next_token = arg_t.to(tl.int64)
        elif PICKS:  # (a greedy target skipped the masses: its branch above is the same scalar test)
            next_token = _chunk_choice(chunk_mass_ptr, chunk_pick_ptr, b, chunks * STEPS, seed, offset,
                                       CHUNKS_PAD).to(tl.int64)
            if next_token < 0:  # w = 0 everywhere (p = q to the bit): the target's own draw
                next_token = _token_of(_target_race(target_row, noise_row, b, vocab, inverse_t, max_t, sum_t, seed,
                                                    offset, ROWS, PRECISE_MATH, FAST))
        elif CDF:
            next_token = _cdf_pick(chunk_mass_ptr, target_row, draft_row, b, vocab, chunks * STEPS, has_draft,
                                   inverse_t, inverse_d, greedy_d, max_t, sum_t, max_d, sum_d, arg_d, target_scale,
                                   seed, offset, 4 * ROWS, CHUNKS_PAD, RULE == "block").to(tl.int64)
            if next_token < 0:  # w = 0 everywhere (p = q to the bit): the target's own draw
                next_token = _token_of(_target_race(target_row, noise_row, b, vocab, inverse_t, max_t, sum_t, seed,
                                                    offset, ROWS, PRECISE_MATH, FAST))
        else:
            winner = tl.atomic_xchg(best_ptr + b, 0, sem="relaxed")
            if winner <= 0:
                winner = _target_race(target_row, noise_row, b, vocab, inverse_t, max_t, sum_t, seed, offset,
                                      ROWS, PRECISE_MATH, FAST)
            next_token = _token_of(winner)
        if SCANNED:  # the kernel that scanned wrote the flag with k
            positions = tl.arange(0, GAMMA_PAD)
            tokens = tl.load(draft_tokens_ptr + b * stride_tok_b + positions, mask=positions < GAMMA,
                             other=0).to(tl.int64)
        else:
            tl.store(error_flags_ptr + b, bad * TOKEN_OUT_OF_RANGE)
        _mark(timeline_ptr, mark + 4, next_token.to(tl.int32), TIMELINE)
        _write_row(output_tokens_ptr, next_tokens_ptr, accepted_lengths_ptr, b, k, tokens, next_token, stride_out_b,
                   GAMMA, GAMMA_PAD)
        if SEQUENCE_WAIT:  # every program of the sequence has passed its wait: the next launch starts from 0
            tl.store(done_ptr + b, 0)
        _release(arrivals_ptr, offsets_ptr, b, offset, FAST)
    return last


@triton.jit(do_not_specialize=["seed"])
def _logits_race_kernel(
    draft_tokens_ptr, target_ptr, draft_ptr, target_temp_ptr, draft_temp_ptr, uniforms_ptr, noise_ptr,
    stats_max_ptr, stats_sum_ptr, stats_arg_ptr, mass_ptr, stop_ptr, stop_stats_ptr,
    accepted_lengths_ptr, next_tokens_ptr, output_tokens_ptr, error_flags_ptr, best_ptr, arrivals_ptr, offsets_ptr,
    chunk_mass_ptr, chunk_pick_ptr, timeline_ptr, done_ptr, seed, vocab, mass_splits, chunks, stats_splits,
    pass_programs, stride_tok_b, stride_p_b, stride_p_row, stride_q_b, stride_q_row, stride_u_b, stride_e_b,
    stride_out_b,
    GAMMA: tl.constexpr, GAMMA_PAD: tl.constexpr, R_PAD: tl.constexpr,
    MASS_PAD: tl.constexpr, ROWS: tl.constexpr, STEPS: tl.constexpr, PRECISE_MATH: tl.constexpr,
    FAST: tl.constexpr, RULE: tl.constexpr, SCANNED: tl.constexpr, CDF: tl.constexpr, CHUNKS_PAD: tl.constexpr,
    STATS_PAD: tl.constexpr, STOP_STATS: tl.constexpr, VEC: tl.constexpr, TIMELINE: tl.constexpr,
    PDL: tl.constexpr, TOKENS_FIRST: tl.constexpr, LEAN_SCAN: tl.constexpr, PICKS: tl.constexpr,
    SEQUENCE_WAIT: tl.constexpr,
):
    """The race as a launch of its own: program (b, c) is `_race_program`'s. SEQUENCE_WAIT (scan "early"): the
    programs launch sequence by sequence, as pass 1's finish (launch index i = c_id·B + b_id is chunk i % chunks of
    sequence i // chunks), each waiting for its own sequence's pass 1 only."""
    b, chunk = tl.program_id(0), tl.program_id(1)
    if SEQUENCE_WAIT:
        b, chunk = _sequence_by_sequence(b, chunk)
    _race_program(
        b, chunk, draft_tokens_ptr, target_ptr, draft_ptr, target_temp_ptr, draft_temp_ptr,
        uniforms_ptr, noise_ptr, stats_max_ptr, stats_sum_ptr, stats_arg_ptr, mass_ptr, stop_ptr, stop_stats_ptr,
        accepted_lengths_ptr, next_tokens_ptr, output_tokens_ptr, error_flags_ptr, best_ptr, arrivals_ptr, offsets_ptr,
        chunk_mass_ptr, chunk_pick_ptr, timeline_ptr, done_ptr, seed, vocab, mass_splits, chunks, stats_splits,
        pass_programs, stride_tok_b, stride_p_b, stride_p_row, stride_q_b, stride_q_row, stride_u_b, stride_e_b,
        stride_out_b, GAMMA, GAMMA_PAD, R_PAD, MASS_PAD, ROWS, STEPS, PRECISE_MATH, FAST, RULE, SCANNED, CDF,
        CHUNKS_PAD, STATS_PAD, STOP_STATS, VEC, ".cg" if SEQUENCE_WAIT else "", TIMELINE, PDL, TOKENS_FIRST,
        LEAN_SCAN, PICKS, SEQUENCE_WAIT)


# --- one launch (fused_logits single=True): pass 1 and the race in one grid, sequence by sequence --------------------
@triton.jit(do_not_specialize=["seed"])
def _one_launch_kernel(
    draft_tokens_ptr, target_ptr, draft_ptr, target_temp_ptr, draft_temp_ptr, uniforms_ptr, noise_ptr,
    stats_max_ptr, stats_sum_ptr, stats_arg_ptr, accepted_lengths_ptr, next_tokens_ptr, output_tokens_ptr,
    error_flags_ptr, best_ptr, arrivals_ptr, offsets_ptr, chunk_mass_ptr, done_ptr,
    seed, batch, vocab, span, splits, chunks, lag,
    stride_tok_b, stride_p_b, stride_p_row, stride_q_b, stride_q_row, stride_u_b, stride_e_b, stride_out_b,
    GAMMA: tl.constexpr, GAMMA_PAD: tl.constexpr, R_PAD: tl.constexpr, TILE: tl.constexpr, VEC: tl.constexpr,
    ROWS: tl.constexpr, STEPS: tl.constexpr, RACE_VEC: tl.constexpr, PRECISE_MATH: tl.constexpr,
    FAST: tl.constexpr, CDF: tl.constexpr, CHUNKS_PAD: tl.constexpr, STATS_PAD: tl.constexpr,
):
    """Grid (B·((2γ+1)·splits + chunks),): pass 1's programs and the race's in one launch (token rule), so a
    sequence's race reads its rows k while they are still in L2 and runs beside later sequences' pass 1, and
    no launch boundary separates the two (the two-launch design re-reads rows k from DRAM once pass 1 has
    streamed every other row through the L2, and its race's latency chain starts only after pass 1's last
    wave). The programs, in index order: pass 1 of sequences 0..lag-1; then for g = lag..B-1, pass 1 of
    sequence g followed by the race of sequence g - lag; then the races of the last `lag` sequences. A pass-1
    program is `_row_stats_program` (its partials, uncombined) and counts itself done for its sequence
    (done_ptr, int32 [B], release); a race program waits until its sequence's (2γ+1)·splits pass-1 programs
    are done (acquire), then is `_race_program` with the scan in every program (scan "race"; the partials read
    from L2). A race program waits only on programs of lower index, which the GPU dispatched no earlier
    (blocks start in index order, as the verify_pack scan and CUB's single-pass scan rely on), and a pass-1
    program waits on nothing: no deadlock whatever is resident. `lag` sequences between a sequence's pass 1
    and its race give its pass 1 about one wave of programs to finish before its race programs take slots to
    wait in. The sequence's last race arrival resets its done count (every program of the sequence has read
    it), so the next launch or graph replay starts clean.
    Measured on the H200 (docs/perf-notes.md, "Session 17"): no faster than the two launches where it matters.
    Short lags were slower (race programs waiting in slots pass 1 needs); lag B was the fastest order at b = 128,
    and there the rows k come from DRAM as in the two-launch design. fused_logits does not use it by default."""
    t = tl.program_id(0)
    pass_items = (2 * GAMMA + 1) * splits
    group = pass_items + chunks
    head = lag * pass_items  # sequences 0..lag-1: pass 1 only
    middle = (batch - lag) * group
    in_head = t < head
    in_tail = t >= head + middle
    u = tl.maximum(t - head, 0)
    g = lag + u // group
    w = u % group
    v = tl.maximum(t - head - middle, 0)
    is_pass = in_head | (~in_tail & (w < pass_items))
    seq = tl.where(in_head, t // pass_items, tl.where(in_tail, batch - lag + v // chunks,
                                                      tl.where(w < pass_items, g, g - lag)))
    item = tl.where(in_head, t % pass_items, tl.where(in_tail, v % chunks,
                                                      tl.where(w < pass_items, w, w - pass_items)))
    if is_pass:
        # (COMBINE and SCAN off: the pointers after stats_arg_ptr are never touched; int32 ones stand in)
        _row_stats_program(
            seq * (2 * GAMMA + 1) + item // splits, item % splits, target_ptr, draft_ptr, target_temp_ptr,
            draft_temp_ptr, stats_max_ptr, stats_sum_ptr, stats_arg_ptr, stats_max_ptr, stats_sum_ptr, stats_arg_ptr,
            arrivals_ptr, draft_tokens_ptr, uniforms_ptr, offsets_ptr, arrivals_ptr, arrivals_ptr, error_flags_ptr,
            done_ptr, seed, vocab, span, splits, stride_p_b, stride_p_row, stride_q_b, stride_q_row, stride_tok_b,
            stride_u_b, GAMMA, TILE, False, STATS_PAD, False, GAMMA_PAD, R_PAD, PRECISE_MATH, FAST, VEC, PRECISE_MATH,
            False, True, False)
        _count_done(done_ptr, seq)
    else:  # (waits for its sequence's pass 1, `_wait_for_sequence`; the last arrival resets the count)
        _race_program(
            seq, item, draft_tokens_ptr, target_ptr, draft_ptr, target_temp_ptr, draft_temp_ptr, uniforms_ptr,
            noise_ptr, stats_max_ptr, stats_sum_ptr, stats_arg_ptr, stats_max_ptr, arrivals_ptr, stats_max_ptr,
            accepted_lengths_ptr, next_tokens_ptr, output_tokens_ptr, error_flags_ptr, best_ptr, arrivals_ptr,
            offsets_ptr, chunk_mass_ptr, chunk_mass_ptr, done_ptr, done_ptr, seed, vocab, 1, chunks, splits,
            pass_items, stride_tok_b, stride_p_b, stride_p_row, stride_q_b, stride_q_row, stride_u_b, stride_e_b,
            stride_out_b, GAMMA, GAMMA_PAD, R_PAD, 1, ROWS, STEPS, PRECISE_MATH, FAST, "token", False, CDF,
            CHUNKS_PAD, STATS_PAD, False, RACE_VEC, ".cg", False, False, False, True, False, True)


# --- vllm_v2_style: Gumbel resample per block, finish (its scan: `_scan_kernel`) --------------------------------
@triton.jit(do_not_specialize=["seed"])
def _vllm_resample_kernel(
    target_ptr, draft_ptr, target_temp_ptr, draft_temp_ptr, noise_ptr, stop_ptr, stop_stats_ptr, block_best_ptr,
    offsets_ptr, seed, vocab, blocks,
    stride_p_b, stride_p_row, stride_q_b, stride_q_row, stride_e_b,
    GAMMA: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr, PRECISE_MATH: tl.constexpr,
    FAST: tl.constexpr,
):
    """Grid (B, blocks): the block's best packed race key of row k (w/E; the Gumbel-max form
    log w - log E orders the same) into block_best [B, blocks]. The BLOCK columns are swept 4·ROWS
    at a time (a whole 8192-column tile of int64 keys per program would spill)."""
    b = tl.program_id(0).to(tl.int64)
    block = tl.program_id(1)
    offset = _philox_offset(offsets_ptr, b, FAST)
    k = tl.load(stop_ptr + b)
    stats = stop_stats_ptr + b * 6
    temperature_t, temperature_d = tl.load(target_temp_ptr + b), tl.load(draft_temp_ptr + b)
    best = tl.full([ROWS, 4], -1, tl.int64)
    if temperature_t != 0:
        draft_k = tl.minimum(k, GAMMA - 1)
        target_row = target_ptr + b * stride_p_b + k * stride_p_row
        draft_row = draft_ptr + b * stride_q_b + draft_k * stride_q_row
        inverse_t, inverse_d = _inverse_temperature(temperature_t), _inverse_temperature(temperature_d)
        max_t, sum_t, max_d, sum_d = tl.load(stats + 0), tl.load(stats + 1), tl.load(stats + 2), tl.load(stats + 3)
        arg_d = tl.load(stats + 5).to(tl.int32, bitcast=True)
        for step in range(0, BLOCK, 4 * ROWS):
            start = block * BLOCK + step
            cols = _chunk_columns(start, ROWS)
            noise = _race_noise(noise_ptr + b * stride_e_b, b, start, cols, vocab, seed, offset, ROWS, PRECISE_MATH,
                                FAST)
            keys = _row_keys(target_row, draft_row, noise, cols, vocab, k < GAMMA, inverse_t, inverse_d,
                                temperature_d == 0, max_t, sum_t, max_d, sum_d, arg_d, 1.0, PRECISE_MATH, FAST,
                                False)
            best = tl.maximum(best, keys)
    tl.store(block_best_ptr + b * blocks + block, tl.max(tl.max(best, axis=1), axis=0))


@triton.jit(do_not_specialize=["seed"])
def _vllm_finish_kernel(
    draft_tokens_ptr, target_ptr, target_temp_ptr, noise_ptr, stop_ptr, stop_stats_ptr, block_best_ptr,
    accepted_lengths_ptr, next_tokens_ptr, output_tokens_ptr, offsets_ptr,
    seed, vocab, blocks,
    stride_tok_b, stride_p_b, stride_p_row, stride_e_b, stride_out_b,
    GAMMA: tl.constexpr, GAMMA_PAD: tl.constexpr, BLOCKS_PAD: tl.constexpr, ROWS: tl.constexpr,
    PRECISE_MATH: tl.constexpr, FAST: tl.constexpr,
):
    """Grid (B,): the winner over the blocks (or row k's argmax for a greedy target) -> outputs. The last of
    the four launches to read offsets_ptr[b], so it advances it by one (stream order)."""
    b = tl.program_id(0).to(tl.int64)
    offset = _philox_offset(offsets_ptr, b, FAST)
    k = tl.load(stop_ptr + b)
    stats = stop_stats_ptr + b * 6
    temperature_t = tl.load(target_temp_ptr + b)
    index = tl.arange(0, BLOCKS_PAD)
    winner = tl.max(tl.load(block_best_ptr + b * blocks + index, mask=index < blocks, other=-1), axis=0)
    if temperature_t == 0:
        next_token = tl.load(stats + 4).to(tl.int32, bitcast=True).to(tl.int64)
    else:
        if winner <= 0:
            winner = _target_race(target_ptr + b * stride_p_b + k * stride_p_row, noise_ptr + b * stride_e_b, b, vocab,
                                  _inverse_temperature(temperature_t), tl.load(stats + 0), tl.load(stats + 1),
                                  seed, offset, ROWS, PRECISE_MATH, FAST)
        next_token = _token_of(winner)
    positions = tl.arange(0, GAMMA_PAD)
    tokens = tl.load(draft_tokens_ptr + b * stride_tok_b + positions, mask=positions < GAMMA, other=0).to(tl.int64)
    _write_row(output_tokens_ptr, next_tokens_ptr, accepted_lengths_ptr, b, k, tokens, next_token, stride_out_b,
               GAMMA, GAMMA_PAD)
    if FAST:
        tl.store(offsets_ptr + b, offset + 1)


# --- launchers ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class LogitsTensors:
    """The inputs of one call as the kernels see them (last dimensions contiguous)."""

    draft_tokens: torch.Tensor  # [B, γ]
    target_logits: torch.Tensor  # [B, γ+1, V]
    draft_logits: torch.Tensor  # [B, γ, V]
    target_temperature: torch.Tensor  # [B] float32
    draft_temperature: torch.Tensor  # [B] float32
    uniforms: torch.Tensor  # [B, γ] float32
    exponential_noise: torch.Tensor  # [B, V] float32

    @property
    def shape(self) -> tuple[int, int, int]:
        batch, gamma = self.draft_tokens.shape
        return batch, gamma, self.target_logits.shape[2]

    def check(self) -> None:
        for name in ("draft_tokens", "target_logits", "draft_logits", "uniforms", "exponential_noise"):
            if getattr(self, name).stride(-1) != 1:
                raise ValueError(f"{name} needs a contiguous last dimension (call .contiguous())")
        for name in ("target_temperature", "draft_temperature"):
            tensor = getattr(self, name)
            if tensor.dtype != torch.float32 or not tensor.is_contiguous():
                raise ValueError(f"{name} must be a contiguous float32 [B] tensor, got {tensor.dtype}")


@dataclass(frozen=True)
class StatsPlan:
    """How pass 1 splits each row: `splits` programs of `span` columns (a multiple of `tile`), each sweeping
    `tile` columns a step with `num_warps` warps (None: `stats_tile` of the logits' dtype and STATS_WARPS;
    `logits_kernels` varies them)."""

    span: int
    splits: int
    tile: int | None = None
    num_warps: int | None = None


def stats_plan(rows: int, vocab: int, target_programs: int, tile: int = TILE, min_tiles: int = 1,
               wave: int | None = None, max_splits: int = STATS_SPLITS_BELOW_WAVE) -> StatsPlan:
    """About target_programs programs over the rows, in equal spans: one tile per program when every
    tile of every row fits one wave (`wave` programs at once; default target_programs); otherwise
    ⌈tiles / wanted⌉ tiles (rounded up, so the splits are balanced and never more than wanted =
    ⌈target_programs / rows⌉), and at least min_tiles; below one wave, longer spans until the splits are
    at most max_splits and padding them to a power of two wastes at most a quarter."""
    tiles = triton.cdiv(vocab, tile)
    wave = target_programs if wave is None else wave
    if rows * tiles <= wave:
        span_tiles = 1
    else:
        wanted = max(1, min(tiles, triton.cdiv(target_programs, rows)))
        span_tiles = max(triton.cdiv(tiles, wanted), min(min_tiles, tiles))
    # Below one wave the step is latency, and whoever combines the partials (every race program, at these
    # sizes) loads a [rows, next_power_of_2(splits)] tile: longer spans until there are at most
    # STATS_SPLITS_BELOW_WAVE and the padding wastes at most a quarter (H200, bf16, cold, pass 1 + race:
    # b=1, γ=16, V=151936, 38 splits of 4 tiles 15.0 µs, 30 of 5 13.1; b=1, γ=4, V=128256, 126 of 1
    # 9.1, 32 of 4 8.5, warm 7.9 and 6.4).
    def wasteful(span_tiles: int) -> bool:
        splits = triton.cdiv(tiles, span_tiles)
        return splits > max_splits or 4 * triton.next_power_of_2(splits) > 5 * splits

    while span_tiles < tiles and rows * triton.cdiv(tiles, span_tiles) < wave and wasteful(span_tiles):
        span_tiles += 1
    return StatsPlan(span=span_tiles * tile, splits=triton.cdiv(tiles, span_tiles))


def stats_tile(element_size: int) -> int:
    """Pass 1's columns a step for logits of `element_size` bytes: 4 KiB a step at 4 warps (two 16-byte lanes a
    thread, two steps in flight), whatever the dtype. bf16 used to step 1024 columns like float32, i.e. half
    the bytes in flight a thread (H200, pass 1 alone, µs, cold / warm, 1024 -> 2048 columns: b=32, γ=8, V=32000 13.9 /
    12.0 -> 12.9 / 10.7; b=128, γ=4, V=32000 24.7 / 23.5 -> 23.4 / 21.8; b=512, γ=4, V=32000 75.0 -> 75.6)."""
    return STATS_TILE if INTERPRETED else STATS_TILE * 4 // element_size  # (interpreted: small rows keep their splits)


def _sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def default_stats_plan(batch: int, gamma: int, vocab: int, device: torch.device,
                       per_sm: int = STATS_PER_SM_GUESS, element_size: int = 4,
                       max_splits: int = STATS_SPLITS_BELOW_WAVE) -> StatsPlan:
    """Pass 1's split: about STATS_WAVES waves of `per_sm` resident programs per SM (the launcher passes the
    compiled kernel's), so the last, partial wave is a small part of the stream; at least STATS_MIN_TILES
    tiles a program once the rows' tiles exceed one wave. Measured on the H200 (bf16, cold, pass 1 alone):
    b=32, γ=8, V=128256 took 53 µs in 4 splits (1.4 waves of 12 programs per SM), 45 in 16 (5.5 waves);
    b=1, γ=16, V=128256: one tile per program gave 4158 programs, two waves, each paying its fixed costs
    over one tile's stream, 14.3 µs; four tiles, 7.9 µs. A plan of one to two waves whose rows fit one wave
    with longer spans takes those instead (no tail wave)."""
    rows = batch * (2 * gamma + 1)
    tile = stats_tile(element_size)  # (the plan leaves its tile None: `_stats_launch` steps the same for the dtype)
    if device.type != "cuda":
        return stats_plan(rows, vocab, 3 * rows, tile)  # the interpreter: a few splits, to exercise the combine
    return pass_one_plan(rows, vocab, tile, per_sm * _sms(device), max_splits)


def pass_one_plan(rows: int, vocab: int, tile: int, wave: int, max_splits: int = STATS_SPLITS_BELOW_WAVE) -> StatsPlan:
    """`default_stats_plan` on a GPU, for `wave` resident programs at once and a step of `tile` columns (the
    logits_kernels tool plans its tile and warps variants with it too)."""
    plan = stats_plan(rows, vocab, STATS_WAVES * wave, tile, STATS_MIN_TILES, wave=wave, max_splits=max_splits)
    # Between one and two waves the second is a tail that pays a whole program's latency for a fraction of the
    # stream: where longer spans fit every row in one wave, take them (then, below the wave, the padding rule,
    # which may take longer spans still: the rule fires at two states of the grid, both measured).
    # H100, pass 1, cold / warm µs: b=32, γ=4, V=32000, fp32, 8 splits (1.45 waves) 15.0 / 10.0, 4 splits
    # 14.8 / 7.7 (the vLLM-style peer's 8192-column blocks had beaten us there by 1%, warm); b=32, γ=8,
    # V=32000, bf16, 4 splits (1.83 waves) 15.4 / 10.8, 2 splits 14.6 / 10.8. At 2.75 waves (b=32, γ=8,
    # V=32000, fp32) halving the splits to 1.37 waves cost 0.8 µs: beyond two waves the tail is a small part.
    tiles = triton.cdiv(vocab, tile)
    if wave < rows * plan.splits <= 2 * wave:
        one_wave = (n for n in range(plan.span // tile, tiles + 1) if rows * triton.cdiv(tiles, n) <= wave)
        span_tiles = next(one_wave, None)
        if span_tiles is not None:
            plan = stats_plan(rows, vocab, STATS_WAVES * wave, tile, span_tiles, wave=wave, max_splits=max_splits)
    return plan


def default_row_plan(rows: int, vocab: int, device: torch.device, tile: int = TILE, min_tiles: int = 1) -> StatsPlan:
    """The split of the block rule's row pairs that fills the machine (STATS_PROGRAMS_PER_SM a SM)."""
    if device.type == "cuda":
        return stats_plan(rows, vocab, STATS_PROGRAMS_PER_SM * _sms(device), tile, min_tiles)
    return stats_plan(rows, vocab, 3 * rows, tile)  # the interpreter: a few splits, to exercise the combine


def race_steps(batch: int, chunks: int, wave: int) -> int:
    """Chunks per race program: the fewest that keep B·programs within one wave of resident programs
    (`wave` at once), but at least RACE_MIN_PROGRAMS programs a sequence; balanced over the row (the last
    program may get fewer; its steps past V read nothing). Beyond one wave the race paid its per-program
    latency chain (stop, stats, two rows, an arrival) once per wave; with one or two programs a sequence it
    streams too little at once. H200, bf16, cold, race alone: b=32, V=128256, 4032 one-chunk programs at 8
    resident per SM 16.8 µs, one wave 11.9; b=512, γ=8, V=128256, one program a sequence 130 µs, two 88,
    four 84, six 82, ten 83."""
    programs = max(1, min(chunks, max(wave // batch, RACE_MIN_PROGRAMS)))
    return triton.cdiv(chunks, triton.cdiv(chunks, triton.cdiv(chunks, programs)))


@dataclass(frozen=True)
class RacePlan:
    """How the race pass covers each sequence's stopping row: `programs` programs of `steps` steps of
    4·`rows` columns each."""

    rows: int
    steps: int
    programs: int
    num_warps: int


def default_race_plan(batch: int, vocab: int, device: torch.device, per_sm: int = RACE_PER_SM_GUESS,
                      token_race: bool = False) -> RacePlan:
    """The prob sampler's chunk choice (small chunks at small B, for latency), capped on a GPU at
    RACE_CHUNK_MAX columns a step, then race_steps steps a program for one wave of `per_sm` resident
    programs per SM (the launcher passes the compiled kernel's).
    token_race (the token rule's race in fused_logits' two launches): where those programs would not fill the
    machine (`_race_fills_the_machine`: every race program then scans and combines its sequence's partials
    itself), the cap is RACE_SCAN_CHUNK_MAX instead, as long as that still leaves two programs an SM. An empirical
    rule, from the H100 (docs/perf-notes.md, "Session 28"; b = 8-64 at V = 32000, 128256 and 151936). bf16: the
    graph view 0.2-1.4 µs shorter, the gpu view 1.1 shorter to 0.4 longer. fp32: -0.8 to +0.4 µs. At b = 32,
    V = 32000 a sequence keeps 16 programs, of one 2048-column step instead of two 1024-column ones. With fewer than
    two programs an SM it was slower (b = 2, V = 151936, 150 programs: +0.3 µs). Where the scan runs (`default_scan`)
    is decided on the RACE_CHUNK_MAX plan, so it never moves. The one launch (token rule) takes the same plan, so its
    draws are the two launches' (its chunks set the inversion's masses); it was not timed with it. The block rule's
    race keeps RACE_CHUNK_MAX: it was not timed with the rule alone (0.2-0.9 µs slower with it and another change at
    once)."""
    if device.type != "cuda":  # the interpreter: two programs per row, to exercise the loop and the combine
        return _race_plan(batch, vocab, device, CHUNK_MAX, 2 * batch)
    wave = per_sm * _sms(device)
    capped = _race_plan(batch, vocab, device, RACE_CHUNK_MAX, wave)
    if not token_race or _race_fills_the_machine(batch, capped, device):
        return capped
    larger = _race_plan(batch, vocab, device, RACE_SCAN_CHUNK_MAX, wave)
    return larger if batch * larger.programs * larger.steps >= 2 * _sms(device) else capped


def _race_plan(batch: int, vocab: int, device: torch.device, chunk_max: int, wave: int) -> RacePlan:
    race = default_fused_plan(batch, vocab, device, chunk_max=chunk_max)
    steps = race_steps(batch, race.splits, wave)
    return RacePlan(rows=race.rows, steps=steps, programs=triton.cdiv(race.splits, steps), num_warps=race.num_warps)


def _race_fills_the_machine(batch: int, race: RacePlan, device: torch.device) -> bool:
    """B·chunks >= RACE_PROGRAMS_PER_SM per SM: enough of the stopping rows' chunks that repeating a
    sequence's scan or combine in every program would cost throughput, not only latency beside the others."""
    full = RACE_PROGRAMS_PER_SM * _sms(device) if device.type == "cuda" else 2 * batch  # interpreter: the rule's shape
    return batch * race.programs * race.steps >= full


# The largest batch at which the race that fills the machine scans "early" (with PDL) rather than in the scan kernel.
# Measured on the H200 (docs/perf-notes.md, "Session 40"; GPU µs, default -> early): at b = 128, 17 of 18 (state,
# L2) pairs gained (128:8:128256 bf16 cold 145.4 -> 139.9, 128:16:32000 fp32 cold 124.4 -> 121.6) and 128:4:32000
# bf16 warm lost 0.1-0.4; b = 32 at V = 128256 and 151936 gained where γ >= 8 (32:16:151936 bf16 cold 85.5 -> 81.0)
# and sat within -0.9 / +1.0 at γ = 4; b = 512 lost at all three states timed (512:8:32000 bf16 cold 139.1 -> 140.6,
# warm 138.6 -> 141.4). Session 41: b = 64 gained too (64:8:128256 bf16 cold 78.6 -> 74.3 against the scan kernel).
EARLY_MAX_BATCH = 128


def default_scan(batch: int, race: RacePlan, device: torch.device, pdl: bool = False) -> str:
    """Where the token rule's accept scan runs. Where the race fills the machine: "early" (with PDL, up to
    EARLY_MAX_BATCH): every race program scans, each starting once its own sequence's pass 1 is done, so the early
    sequences' races run beside pass 1's last programs, and no kernel sits between the passes; pass 1 pays a
    release arrival a program (~0.7-1.1 µs of pass 1 at b = 32, γ = 4, V = 128256) and the race a scan a program,
    which cost more than they save at b = 512. (Timed on the H200 at b = 32 and 128, session 40, and where the rule
    took it untimed, session 41: b = 64 at V = 128256 2.1-4.3 µs below the scan kernel, b = 16 at V = 151936 level;
    early where the race does not fill the machine moved -0.9 to +1.0 µs with no sign, so "race" stays there.)
    Otherwise "kernel", a launch of its own between the passes:
    pass 1 then makes no arrival atomics (at b=128, γ=16, V=32000, bf16 its old acq_rel arrivals took pass 1 from
    77 to 97 µs) and the race starts from k and row k's normalisers. "race" (every race program combines the rows'
    partials and scans, after all of pass 1) where the race does not fill the machine: the repeats run beside
    each other, and a launch between the passes would add its latency (~4 µs) to a 10 µs step."""
    if not _race_fills_the_machine(batch, race, device):
        return "race"
    return "early" if pdl and batch <= EARLY_MAX_BATCH else "kernel"


def default_combine(batch: int, race: RacePlan, device: torch.device) -> bool:
    """Whether pass 1 combines each row's partials when the race scans (scan "race"; the block rule). Combining
    costs an acq_rel arrival per pass-1 program; not combining makes every race program combine (2γ+1)·splits
    partials, which costs throughput only where the race fills the machine. Measured on the H200 (GPU µs,
    cold, pass 1 + race): b=1, γ=16, V=128256 bf16 11.8 without against 12.5 with; b=32, γ=8, V=128256 bf16
    79.7 against 71.6."""
    return _race_fills_the_machine(batch, race, device)


# The most row partials ([R_PAD, splits] of a sequence, padded) that a race program loads after the draft tokens'
# logits under PDL. Measured on the H100 (session 24, `logits/kernels/9-tokens-order`): with 64-256 partials (b = 32,
# V = 32000, bf16, γ = 4-16) the tokens first were as fast or 0.1-0.6 µs faster at every state, both views; with
# 1024-2048 (b = 1, γ ≥ 8) the tokens last were up to 0.7 µs faster (b = 1, γ = 16, V = 32000, fp32, warm: 8.8
# against 9.5), their big stats load no longer queued behind the 2γ gathered logits (the order session 21 measured
# on the H200 without PDL). 512 (session 25, `10-tokens-order-512`: b = 1, γ = 4 at V = 32000 fp32 and V = 128256
# bf16 and fp32, γ = 8 at V = 32000 bf16; b = 32, γ = 16, V = 32000, fp32): at b = 1 the tokens first lean ahead (11
# of 16 view and L2 states, by at most 0.3 µs), at b = 32 the tokens last (0.5 µs, cold, gpu view). The bound stays:
# the lean is small, and moving it would move the b = 32 state the wrong way (docs/perf-notes.md, "Session 25").
TOKENS_FIRST_MAX_PARTIALS = 256


def default_tokens_first(gamma: int, stats_splits: int, pdl: bool) -> bool:
    """Whether a race program that scans loads the draft tokens' logits before the rows' stats: with PDL (they
    then load while pass 1 ends), unless the stats it loads are many partials (`TOKENS_FIRST_MAX_PARTIALS`)."""
    partials = triton.next_power_of_2(2 * gamma + 1) * triton.next_power_of_2(stats_splits)
    return pdl and partials <= TOKENS_FIRST_MAX_PARTIALS


def _precise_math(device: torch.device) -> bool:
    return device.type == "cuda" and not INTERPRETED


def triton_launches_pdl() -> bool:
    """Whether this Triton's CUDA launcher takes launch_pdl (a CUDA compile option since Triton 3.3)."""
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:
        return False
    return "launch_pdl" in getattr(CUDAOptions, "__dataclass_fields__", {})


def pdl_available(device: torch.device) -> bool:
    """Programmatic dependent launch: an sm_90+ GPU, compiled kernels, and a Triton whose launcher takes
    launch_pdl (`sdbench doctor` says which of them is missing)."""
    if device.type != "cuda" or INTERPRETED or torch.cuda.get_device_capability(device) < (9, 0):
        return False
    return triton_launches_pdl()


def _pdl_meta(pdl: bool) -> dict:
    """A kernel's PDL constexpr (it waits for the kernel ahead) and, when on, the launch option that asks for
    programmatic dependent launch (left out when off: any Triton takes that)."""
    return dict(PDL=pdl, launch_pdl=True) if pdl else dict(PDL=False)


def _race_vec(element_size: int, race_rows: int, num_warps: int) -> int:
    """The race's inversion lanes: 16 bytes of logits a lane where every thread still gets a lane (chunks of
    4·race_rows columns over num_warps warps; 1024 bf16 columns at 4 warps is one lane a thread). Interpreted, where
    no thread exists, up to 16 bytes a lane and at least four lanes a chunk, so the CPU tests run lanes of several
    columns, as the GPU does."""
    threads = 4 if INTERPRETED else 32 * num_warps
    return max(1, min(16 // element_size, 4 * race_rows // threads))


def _pick_group(element_size: int, race_rows: int, num_warps: int) -> int:
    """sample "picks": the lanes of `_race_vec` one thread holds, the unit `_pick_in_chunk` draws within (Triton lays
    a chunk's lanes over the threads, then repeats). Interpreted, two, so the CPU tests run a unit's cross-lane sum."""
    lanes = 4 * race_rows // _race_vec(element_size, race_rows, num_warps)
    return min(2, lanes) if INTERPRETED else max(1, lanes // (32 * num_warps))


def partials_stride(splits: int) -> int:
    """How far apart pass 1 stores consecutive rows' partials: `splits` padded to the power of two the readers' tiles
    have (SPLITS_PAD), a constant the compiler knows, so the readers load them as whole vectors (`_rows_stats`)."""
    return triton.next_power_of_2(splits)


def allocate_stats(batch: int, gamma: int, splits: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """(max, Σexp, argmax) partials of the B·(2γ+1) rows, `partials_stride(splits)` a row. The readers load the
    padding after a row's splits and never use it; zeroed here, once (scratch is allocated when a launch is
    prepared), so what they load was at least written (compute-sanitizer's initcheck)."""
    count = batch * (2 * gamma + 1) * partials_stride(splits)
    return (torch.zeros(count, dtype=torch.float32, device=device), torch.zeros(count, dtype=torch.float32, device=device),
            torch.zeros(count, dtype=torch.int32, device=device))


def bf16_words_apply(t: LogitsTensors, span: int) -> bool:
    """Whether pass 1 can read these logits as 32-bit words (`_load_tile`): bf16, and every tile of every row of both
    tensors starts 4-byte aligned (a 4-byte aligned base, even strides, and an even span: a split starts at
    split · span, its tiles a whole step apart)."""
    return span % 2 == 0 and all(x.element_size() == 2 and x.data_ptr() % 4 == 0 and x.stride(0) % 2 == 0
                                 and x.stride(1) % 2 == 0 for x in (t.target_logits, t.draft_logits))


def _stats_launch(t: LogitsTensors, stats: tuple[torch.Tensor, ...], plan: StatsPlan, tile: int | None = None,
                  combined: tuple[torch.Tensor, ...] | None = None, scan: dict | None = None,
                  timeline: torch.Tensor | None = None, pdl: bool = False, skip_greedy_drafts: bool = False,
                  bf16_words: bool = False, read_first: bool = False, done: torch.Tensor | None = None):
    """Pass 1 into the per-split partials `stats`; with `combined` = (row max, row sum, row argmax, arrivals),
    each row's last program also combines its partials there (COMBINE); with `scan` (the keys of
    `_scan_in_pass_one`'s tensors: offsets, sequence_arrivals, stop, error_flags; and fast, seed) the
    sequence's last combined row also runs the accept scan (SCAN). With `timeline` (int64, PASS1_MARKS a program,
    zeroed), a timeline build (`_mark`). pdl: its programs let a kernel launched with launch_pdl after it start
    (`_let_next_kernel_start`). skip_greedy_drafts (the token rule): greedy requests' draft rows are not read.
    bf16_words (`_load_tile`): bf16 logits read as 32-bit words where `bf16_words_apply` (else, and for float32, as
    elements); its callers name it. read_first (with skip_greedy_drafts, B <= READ_FIRST_MAX_BATCH): the reading
    programs launch first (`_read_first`). done (int32 [B], zeroed; scan "early"): the programs launch sequence by
    sequence and count themselves done for their sequence there (SEQUENCE_DONE)."""
    batch, gamma, vocab = t.shape
    if read_first and done is not None:
        raise ValueError("read_first and done (scan 'early') each order pass 1's programs: one at a time")
    if read_first and not (skip_greedy_drafts and batch <= READ_FIRST_MAX_BATCH):
        raise ValueError(f"read_first orders the programs greedy drafts leave empty, up to B = {READ_FIRST_MAX_BATCH}")
    words = bf16_words and bf16_words_apply(t, plan.span)
    combine = combined is not None
    device = t.draft_tokens.device
    if tile is not None and plan.tile is not None and tile != plan.tile:
        raise ValueError(f"a step of {tile} columns asked for a plan made in steps of {plan.tile}")
    tile = tile or plan.tile or stats_tile(t.target_logits.element_size())
    if scan is None:  # no scan: the kernel never reads these; any int tensor of the device stands in
        stand_in = stats[2]
        scan_tensors, fast, seed = (stand_in,) * 4, False, 0
    else:
        scan_tensors = (scan["offsets"], scan["sequence_arrivals"], scan["stop"], scan["error_flags"])
        fast, seed = scan["fast"], scan["seed"]
    args = (t.target_logits, t.draft_logits, t.target_temperature, t.draft_temperature, *stats,
            *(combined if combine else stats + (stats[2],)), t.draft_tokens, t.uniforms, *scan_tensors,
            stats[2] if timeline is None else timeline, stats[2] if done is None else done, seed, vocab, plan.span,
            plan.splits, t.target_logits.stride(0), t.target_logits.stride(1), t.draft_logits.stride(0),
            t.draft_logits.stride(1), t.draft_tokens.stride(0), t.uniforms.stride(0))
    meta = dict(GAMMA=gamma, TILE=tile, COMBINE=combine, SPLITS_PAD=partials_stride(plan.splits),
                SCAN=scan is not None, GAMMA_PAD=triton.next_power_of_2(gamma),
                R_PAD=triton.next_power_of_2(2 * gamma + 1), PRECISE_MATH=_precise_math(device), FAST=fast,
                VEC=16 // t.target_logits.element_size(), FTZ_EXP2=_precise_math(device),
                TIMELINE=timeline is not None, PDL=pdl, SKIP_GREEDY_DRAFTS=skip_greedy_drafts, WORDS=words,
                READ_FIRST=read_first, BATCH_PAD=triton.next_power_of_2(batch) if read_first else 1,
                SEQUENCE_DONE=done is not None, num_warps=(plan.num_warps or STATS_WARPS) if not INTERPRETED else 1)
    return BoundLaunch(_row_stats_kernel, (batch * (2 * gamma + 1), plan.splits), args, meta, device)


def fused_logits_launcher(t: LogitsTensors, outputs: dict[str, torch.Tensor], fast: bool, seed: int = 0,
                          offset: int = 0, stats_plan_: StatsPlan | None = None, rule: str = "token",
                          mass_plan: StatsPlan | None = None, race_plan: RacePlan | None = None,
                          scan: str | None = None, sample: str | None = None, combine: bool | None = None,
                          stats_max_splits: int = STATS_SPLITS_BELOW_WAVE, single: bool = False,
                          lag: int | None = None, maxnreg: int | None = None, timeline: bool = False,
                          pdl: bool | None = None, tokens_first: bool | None = None, lean_scan: bool = True,
                          bf16_words: bool | None = None, read_first: bool | None = None):
    """Pass 1 and the race (two launches), the accept scan's kernel between them (scan "kernel"), and the block
    rule's residual-mass pass before the race when γ > 1 (h_γ = w_γ needs no mass). Scratch allocated here,
    once. scan (token rule): where the accept scan runs: "kernel" (`_scan_kernel`, which also combines pass
    1's partials), "race" (every race program), "early" (every race program, each starting on its sequence once
    that sequence's pass 1 is done, not once all of pass 1 is: pass 1 and the race both launch sequence by
    sequence, SEQUENCE_DONE and SEQUENCE_WAIT; with PDL the early sequences' races run beside pass 1's last
    programs) or "pass1" (the sequence's last row of pass 1, after that row's last program combined it); None:
    `default_scan`. sample (fast mode): how the residual token is
    drawn, "cdf" (by inversion in float64, `_cdf_pick`), "picks" (each race program draws a candidate in each of its
    chunks, by a float32 inversion within a thread's lanes and a race between threads, and the last arrival chooses
    only the chunk, by mass: `_pick_in_chunk`, `_chunk_choice`) or "race" (the exponential race on Philox noise per
    column, the draws vllm_v2_style makes); None: picks or cdf by `default_picks`
    (docs/perf-notes.md, "Session 39"). Supplied randomness is the race on the supplied noise, as the reference
    defines it.
    combine (scan "race", the block rule): pass 1's last program of a row combines the
    row's partials (an arrival atomic per program), or (False) every race program combines them; None:
    `default_combine`. "pass1" needs it, "kernel" combines in its own kernel.
    Plans left None are sized on a GPU to the kernels as they compiled (their resident programs per SM);
    stats_max_splits caps pass 1's splits below one wave (`stats_plan`).
    single (token rule): pass 1 and the race in one launch (`_one_launch_kernel`; the scan in every race
    program), `lag` sequences between a sequence's pass 1 and its race (None: B, every race after pass 1),
    maxnreg: a cap on the one kernel's registers a thread (ptxas spills above it). An experiment, not a default
    (docs/perf-notes.md, "Session 17").
    timeline (two launches): a timeline build of pass 1 and the race (`_mark`), whose marks the launch keeps as
    `launch.timeline` = (pass 1's, the race's); a diagnostic (`logits_kernels --timeline`), never timed as the
    design.
    pdl (two launches): the scan kernel and the race launched with programmatic dependent launch, so each one's
    start and input loads overlap the kernel ahead of it (`_wait_for_prior_kernel`); None: where `pdl_available`.
    tokens_first (a race that scans: scan "race" or "early", the block rule): its programs load the draft tokens and
    their logits before the rows' stats (with PDL, during the wait); None: `default_tokens_first`
    (docs/perf-notes.md, "Session 23" and "Session 24").
    lean_scan (the token rule's accept scan, in the race that scans and in the scan kernel): it combines only the rows
    it reads (`_position_stats`); False: all 2γ+1 rows, then picks. The same tokens but at near-ties (`_rows_stats`);
    kept to time the two (docs/perf-notes.md, "Session 26").
    bf16_words (two launches): pass 1 reads bf16 rows as 32-bit words where they are aligned for it (`_stats_launch`;
    None: it does); False, as elements, to time the two (docs/perf-notes.md, "Session 35").
    read_first (two launches, token rule, B <= READ_FIRST_MAX_BATCH): pass 1's reading programs launch before the ones
    a greedy request's draft rows leave empty (`_read_first`); None or False: in row order. Kept to time the two: on
    the H200 it evened out the SMs' programs and made pass 1 no faster (docs/perf-notes.md, "Session 37")."""
    if sample not in (None, "cdf", "picks", "race"):
        raise ValueError(f"sample must be 'cdf', 'picks' or 'race', got {sample!r}")
    if single:
        if timeline:
            raise ValueError("timeline shapes the two-launch design: single=True has none")
        if rule != "token" or scan is not None or combine is not None or mass_plan is not None:
            raise ValueError("single=True is the token rule with the scan in the race: no scan, combine or mass "
                             "plan to choose")
        if stats_max_splits != STATS_SPLITS_BELOW_WAVE:
            raise ValueError("stats_max_splits shapes the two-launch pass-1 plan; single=True plans its own")
        if pdl:
            raise ValueError("pdl overlaps one launch with the next: single=True has one launch")
        if tokens_first is not None or not lean_scan:
            raise ValueError("tokens_first and lean_scan shape the two-launch race: single=True has its own")
        if sample == "picks":
            raise ValueError("sample='picks' is the two-launch race's: single=True draws by 'cdf' or 'race'")
        if bf16_words is not None or read_first is not None:
            raise ValueError("bf16_words and read_first shape the two-launch pass 1: single=True has its own")
        return _one_launch_launcher(t, outputs, fast, seed, offset, stats_plan_, race_plan, sample, lag, maxnreg)
    if lag is not None or maxnreg is not None:
        raise ValueError("lag and maxnreg shape the one-launch grid: they need single=True")
    bf16_words = True if bf16_words is None else bf16_words  # (None only so that single=True can refuse a choice)
    if timeline and (stats_plan_ is None or race_plan is None):
        # (planned here, the timeline kernels' own registers would size its plans, not the shipped kernels')
        raise ValueError("a timeline build mirrors a launch: give it that launch's stats_plan_ and race_plan")
    if scan not in (None, "kernel", "race", "early", "pass1"):
        raise ValueError(f"scan must be 'kernel', 'race', 'early' or 'pass1', got {scan!r}")
    if rule == "block" and scan not in (None, "race"):
        raise ValueError("the block rule scans in the race: its stop needs the mass pass (scan='race')")
    if (scan == "pass1" and combine is False) or (scan in ("kernel", "early") and combine):
        raise ValueError(f"scan={scan!r} with combine={combine}: the pass-1 scan reads combined rows, and the "
                         "scan kernel and the early race combine them themselves")
    if stats_plan_ is not None and stats_max_splits != STATS_SPLITS_BELOW_WAVE:
        raise ValueError("stats_max_splits shapes the default pass-1 plan; with stats_plan_ given it would do nothing")
    batch, gamma, vocab = t.shape
    read_first = bool(read_first)  # (None only so that single=True can refuse a choice; `_stats_launch` checks it)
    device = t.draft_tokens.device
    if pdl is None:  # wherever it is available
        pdl = pdl_available(device)
    elif pdl and not pdl_available(device):
        raise ValueError("pdl needs an sm_90+ GPU, compiled kernels (not the interpreter) and a Triton with launch_pdl")
    element_size = t.target_logits.element_size()
    plan = stats_plan_ or default_stats_plan(batch, gamma, vocab, device, element_size=element_size,
                                             max_splits=stats_max_splits)
    race = race_plan or default_race_plan(batch, vocab, device, token_race=rule == "token")
    if rule == "block":
        scan = "race"
    elif scan is None:  # (combine=True asks pass 1 to combine: the scan kernel would combine again)
        scan = "race" if combine else default_scan(batch, race, device, pdl and not read_first)
    if combine is None:
        combine = scan == "pass1" or (scan == "race" and (rule == "block" or default_combine(batch, race, device)))
    launch = _fused_logits_launch(t, outputs, fast, seed, offset, plan, rule, mass_plan, race, scan, sample,
                                  combine, timeline, pdl, tokens_first, lean_scan, bf16_words, read_first)
    if device.type == "cuda" and not INTERPRETED and (stats_plan_ is None or race_plan is None):
        # the plans again, for whole waves of the kernels as they compiled (registers set how many fit an SM)
        stats_per_sm, race_per_sm = launch.stats_launch.programs_per_sm(), launch.race_launch.programs_per_sm()
        if stats_plan_ is None and stats_per_sm is not None:
            plan = default_stats_plan(batch, gamma, vocab, device, per_sm=stats_per_sm, element_size=element_size,
                                      max_splits=stats_max_splits)
        if race_plan is None and race_per_sm is not None:
            race = default_race_plan(batch, vocab, device, per_sm=race_per_sm, token_race=rule == "token")
        if (plan, race) != launch.plans:
            launch = _fused_logits_launch(t, outputs, fast, seed, offset, plan, rule, mass_plan, race, scan, sample,
                                          combine, timeline, pdl, tokens_first, lean_scan, bf16_words, read_first)
        # (from the kernels compiled with the first plans: the race's registers can move a little with its steps)
        launch.programs_per_sm = (stats_per_sm, race_per_sm)
    return launch


def _fused_logits_launch(t: LogitsTensors, outputs: dict[str, torch.Tensor], fast: bool, seed: int, offset: int,
                         plan: StatsPlan, rule: str, mass_plan: StatsPlan | None, race: RacePlan, scan: str,
                         sample: str | None, combine: bool, timeline: bool = False, pdl: bool = False,
                         tokens_first: bool | None = None, lean_scan: bool = True, bf16_words: bool = True,
                         read_first: bool = False):
    """fused_logits_launcher with every choice made (tokens_first None: `default_tokens_first`)."""
    cdf = fast and sample != "race"
    picks = fast and (sample == "picks" or (sample is None and default_picks(rule, race)))
    batch, gamma, vocab = t.shape
    device = t.draft_tokens.device
    partials = allocate_stats(batch, gamma, plan.splits, device)
    # each row's partials combined by its last pass-1 program; or (combine=False) the partials themselves
    stats = allocate_stats(batch, gamma, 1, device) if combine else partials
    stats_splits = 1 if combine else plan.splits
    if tokens_first is None:
        tokens_first = default_tokens_first(gamma, stats_splits, pdl)
    # (only a race that scans loads the tokens' logits: one that starts from k has no order to choose)
    tokens_first = tokens_first and scan in ("race", "early")
    row_arrivals = torch.zeros(batch * (2 * gamma + 1), dtype=torch.int32, device=device)
    early = scan == "early"
    # scan "early": pass-1 programs done, a sequence. The race's last arrival puts it back to 0 with a plain store,
    # which is safe against the next call's counts only because pass 1 starts with a plain launch (no launch_pdl:
    # it never overlaps the race ahead of it). The count is one-shot: pass 1 and the race run together, as launch()
    # runs them (pass 1 alone would leave it full, and the next race would not wait).
    done = torch.zeros(batch, dtype=torch.int32, device=device)
    best = torch.zeros(batch, dtype=torch.int64, device=device)
    arrivals = torch.zeros(batch, dtype=torch.int32, device=device)
    sequence_arrivals = torch.zeros(batch, dtype=torch.int32, device=device)
    stop = torch.empty(batch, dtype=torch.int32, device=device)
    stop_stats = torch.empty((batch, 6) if scan == "kernel" else 1, dtype=torch.float32, device=device)
    chunks = race.programs * race.steps  # the stopping row's chunks of 4·rows columns, each one mass (cdf)
    chunk_mass = torch.empty(batch * chunks if cdf else 1, dtype=torch.float32, device=device)
    chunk_pick = torch.empty(batch * chunks if picks else 1, dtype=torch.int32, device=device)
    offsets = philox_offsets(batch, offset, device)  # fast mode advances them on the device, call by call
    pass_one_scan = None
    if scan == "pass1":
        pass_one_scan = dict(offsets=offsets, sequence_arrivals=sequence_arrivals, stop=stop,
                             error_flags=outputs["error_flags"], fast=fast, seed=seed)
    marks = None
    if timeline:
        pass1_slots = batch * (2 * gamma + 1) * plan.splits * PASS1_MARKS.value
        marks = (torch.zeros(pass1_slots, dtype=torch.int64, device=device),
                 torch.zeros(batch * race.programs * RACE_MARKS.value, dtype=torch.int64, device=device))
    stats_launch = _stats_launch(t, partials, plan, combined=stats + (row_arrivals,) if combine else None,
                                 scan=pass_one_scan, timeline=None if marks is None else marks[0], pdl=pdl,
                                 skip_greedy_drafts=rule == "token", bf16_words=bf16_words, read_first=read_first,
                                 done=done if early else None)
    launches = [stats_launch]
    pads = dict(GAMMA=gamma, GAMMA_PAD=triton.next_power_of_2(gamma), R_PAD=triton.next_power_of_2(2 * gamma + 1),
                PRECISE_MATH=_precise_math(device))
    if scan == "kernel":
        scan_args = (t.draft_tokens, t.target_logits, t.draft_logits, t.target_temperature, t.draft_temperature,
                     t.uniforms, *partials, stop, stop_stats, offsets, outputs["error_flags"], seed, plan.splits,
                     vocab, t.draft_tokens.stride(0), t.target_logits.stride(0), t.target_logits.stride(1),
                     t.draft_logits.stride(0), t.draft_logits.stride(1), t.uniforms.stride(0))
        scan_meta = dict(pads, SPLITS_PAD=partials_stride(plan.splits), FAST=fast, FLAGS=True, num_warps=4,
                         LEAN_SCAN=lean_scan, **_pdl_meta(pdl))
        launches.append(BoundLaunch(_scan_kernel, (batch,), scan_args, scan_meta, device))
    mass_rows = batch * (gamma - 1) if rule == "block" else 0
    mass_plan = mass_plan or (default_row_plan(mass_rows, vocab, device) if mass_rows else StatsPlan(span=vocab, splits=1))
    mass = torch.empty(max(1, mass_rows * mass_plan.splits), dtype=torch.float32, device=device)
    if mass_rows:
        mass_args = (t.draft_tokens, t.target_logits, t.draft_logits, t.target_temperature, t.draft_temperature, *stats,
                     mass, vocab, stats_splits, mass_plan.span, mass_plan.splits, t.draft_tokens.stride(0),
                     t.target_logits.stride(0), t.target_logits.stride(1), t.draft_logits.stride(0),
                     t.draft_logits.stride(1))
        mass_meta = dict(pads, SPLITS_PAD=partials_stride(stats_splits), TILE=TILE, num_warps=STATS_WARPS if not INTERPRETED else 1)
        launches.append(BoundLaunch(_block_mass_kernel, (mass_rows, mass_plan.splits), mass_args, mass_meta, device))
    args = (
        t.draft_tokens, t.target_logits, t.draft_logits, t.target_temperature, t.draft_temperature, t.uniforms,
        t.exponential_noise, *stats, mass, stop, stop_stats, outputs["accepted_lengths"], outputs["next_tokens"],
        outputs["output_tokens"], outputs["error_flags"], best, arrivals, offsets, chunk_mass, chunk_pick,
        best if marks is None else marks[1], done, seed, vocab, mass_plan.splits, race.programs, stats_splits,
        (2 * gamma + 1) * plan.splits, t.draft_tokens.stride(0), t.target_logits.stride(0),
        t.target_logits.stride(1), t.draft_logits.stride(0), t.draft_logits.stride(1), t.uniforms.stride(0),
        t.exponential_noise.stride(0), outputs["output_tokens"].stride(0),
    )
    meta = dict(pads, MASS_PAD=triton.next_power_of_2(mass_plan.splits), ROWS=race.rows, STEPS=race.steps, FAST=fast,
                RULE=rule, SCANNED=scan in ("pass1", "kernel"), CDF=cdf, CHUNKS_PAD=triton.next_power_of_2(chunks),
                STATS_PAD=partials_stride(stats_splits), STOP_STATS=scan == "kernel", TIMELINE=timeline,
                VEC=_race_vec(t.target_logits.element_size(), race.rows, race.num_warps), TOKENS_FIRST=tokens_first,
                LEAN_SCAN=lean_scan, SEQUENCE_WAIT=early, num_warps=race.num_warps, **_pdl_meta(pdl),
                PICKS=_pick_group(t.target_logits.element_size(), race.rows, race.num_warps) if picks else 0)
    race_launch = BoundLaunch(_logits_race_kernel, (batch, race.programs), args, meta, device)
    launches.append(race_launch)

    def launch() -> None:
        for step in launches:
            step()

    launch.scratch = (best, arrivals, row_arrivals, sequence_arrivals, done)  # tests check they are left zeroed
    launch.scan = scan
    launch.combine = combine
    launch.sample = "picks" if picks else "cdf" if cdf else "race"
    launch.philox_offsets = offsets
    launch.plans = (plan, race)
    launch.stats_launch, launch.race_launch = stats_launch, race_launch
    launch.timeline = marks
    launch.programs_per_sm = None  # set by fused_logits_launcher where it sized the plans to compiled kernels
    launch.pdl, launch.tokens_first, launch.lean_scan, launch.read_first = pdl, tokens_first, lean_scan, read_first
    return launch


def _one_launch_launcher(t: LogitsTensors, outputs: dict[str, torch.Tensor], fast: bool, seed: int, offset: int,
                         plan: StatsPlan | None, race: RacePlan | None, sample: str | None, lag: int | None,
                         maxnreg: int | None = None):
    """fused_logits_launcher(single=True): plans sized to the one kernel as it compiled (a plan given is kept)."""
    batch, gamma, vocab = t.shape
    device = t.draft_tokens.device
    element_size = t.target_logits.element_size()
    launch = _one_launch(t, outputs, fast, seed, offset,
                         plan or default_stats_plan(batch, gamma, vocab, device, element_size=element_size),
                         race or default_race_plan(batch, vocab, device, token_race=True), sample, lag, maxnreg)
    if device.type == "cuda" and not INTERPRETED and (plan is None or race is None):
        per_sm = launch.stats_launch.programs_per_sm()
        if per_sm is not None:
            better = (plan or default_stats_plan(batch, gamma, vocab, device, per_sm=per_sm, element_size=element_size),
                      race or default_race_plan(batch, vocab, device, per_sm=per_sm, token_race=True))
            if better != launch.plans:
                launch = _one_launch(t, outputs, fast, seed, offset, *better, sample, lag, maxnreg)
            launch.programs_per_sm = (per_sm, per_sm)
    return launch


def _one_launch(t: LogitsTensors, outputs: dict[str, torch.Tensor], fast: bool, seed: int, offset: int,
                plan: StatsPlan, race: RacePlan, sample: str | None, lag: int | None,
                maxnreg: int | None = None):
    """The one-launch grid with every choice made (`_one_launch_kernel`); lag None: B."""
    cdf = fast and sample != "race"
    batch, gamma, vocab = t.shape
    device = t.draft_tokens.device
    if plan.tile is not None or plan.num_warps is not None:
        raise ValueError("the one launch steps pass 1 in its dtype's 4 KiB at SINGLE_WARPS warps")
    partials = allocate_stats(batch, gamma, plan.splits, device)
    best = torch.zeros(batch, dtype=torch.int64, device=device)
    arrivals = torch.zeros(batch, dtype=torch.int32, device=device)
    done = torch.zeros(batch, dtype=torch.int32, device=device)
    chunks = race.programs * race.steps
    chunk_mass = torch.empty(batch * chunks if cdf else 1, dtype=torch.float32, device=device)
    offsets = philox_offsets(batch, offset, device)
    pass_items = (2 * gamma + 1) * plan.splits
    lag = batch if lag is None else lag  # every race after all of pass 1: the fastest order measured at b = 128
    if not 1 <= lag <= batch:
        raise ValueError(f"lag must be in [1, B = {batch}], got {lag}")
    args = (t.draft_tokens, t.target_logits, t.draft_logits, t.target_temperature, t.draft_temperature, t.uniforms,
            t.exponential_noise, *partials, outputs["accepted_lengths"], outputs["next_tokens"],
            outputs["output_tokens"], outputs["error_flags"], best, arrivals, offsets, chunk_mass, done, seed, batch,
            vocab, plan.span, plan.splits, race.programs, lag, t.draft_tokens.stride(0), t.target_logits.stride(0),
            t.target_logits.stride(1), t.draft_logits.stride(0), t.draft_logits.stride(1), t.uniforms.stride(0),
            t.exponential_noise.stride(0), outputs["output_tokens"].stride(0))
    warps = SINGLE_WARPS if not INTERPRETED else 1
    element_size = t.target_logits.element_size()
    meta = dict(GAMMA=gamma, GAMMA_PAD=triton.next_power_of_2(gamma), R_PAD=triton.next_power_of_2(2 * gamma + 1),
                TILE=stats_tile(element_size), VEC=16 // element_size,
                ROWS=race.rows, STEPS=race.steps,
                RACE_VEC=_race_vec(element_size, race.rows, warps),
                PRECISE_MATH=_precise_math(device), FAST=fast, CDF=cdf, CHUNKS_PAD=triton.next_power_of_2(chunks),
                STATS_PAD=partials_stride(plan.splits), num_warps=warps)
    if maxnreg is not None and not INTERPRETED:
        meta["maxnreg"] = maxnreg
    one = BoundLaunch(_one_launch_kernel, (batch * (pass_items + race.programs),), args, meta, device)

    def launch() -> None:
        one()

    launch.scratch = (best, arrivals, done)  # tests check they are left zeroed
    launch.scan = "race"
    launch.lag = lag
    launch.sample = "cdf" if cdf else "race"
    launch.philox_offsets = offsets
    launch.plans = (plan, race)
    launch.stats_launch = launch.race_launch = one
    launch.programs_per_sm = None
    return launch


def vllm_v2_style_launcher(t: LogitsTensors, outputs: dict[str, torch.Tensor], fast: bool, seed: int = 0,
                           offset: int = 0, block: int | None = None):
    """Four launches: block stats (one block per program), scan, per-block Gumbel resample, finish."""
    batch, gamma, vocab = t.shape
    device = t.draft_tokens.device
    block = block or (64 if INTERPRETED else VLLM_BLOCK)
    plan = StatsPlan(span=block, splits=triton.cdiv(vocab, block))
    stats = allocate_stats(batch, gamma, plan.splits, device)
    stop = torch.empty(batch, dtype=torch.int32, device=device)
    stop_stats = torch.empty((batch, 6), dtype=torch.float32, device=device)
    block_best = torch.empty((batch, plan.splits), dtype=torch.int64, device=device)
    offsets = philox_offsets(batch, offset, device)  # the finish kernel advances them, call by call
    precise = _precise_math(device)
    # 1024-column steps in any dtype, as every grid before the 4 KiB step measured it: with that step its one-block
    # programs gained at b = 1 and at b = 32, γ = 8 (by <= 1.4 µs, still behind fused_logits) and lost up to 4%
    # elsewhere (H200, bf16; docs/perf-notes.md, "Session 15")
    # greedy requests' draft rows skipped as fused_logits skips them (the token rule; the same pass-1 kernel): a peer
    # no slower for it, whatever vLLM itself reads
    # bf16 rows read as words where aligned, as fused_logits' pass 1 reads them (session 35): the peer keeps sharing it
    stats_launch = _stats_launch(t, stats, plan, tile=min(block, STATS_TILE), skip_greedy_drafts=True,
                                 bf16_words=True)
    scan_args = (t.draft_tokens, t.target_logits, t.draft_logits, t.target_temperature, t.draft_temperature,
                 t.uniforms, *stats, stop, stop_stats, offsets, stop, seed, plan.splits, vocab,  # (no flags: stop stands in)
                 t.draft_tokens.stride(0), t.target_logits.stride(0), t.target_logits.stride(1),
                 t.draft_logits.stride(0), t.draft_logits.stride(1), t.uniforms.stride(0))
    scan_meta = dict(GAMMA=gamma, GAMMA_PAD=triton.next_power_of_2(gamma), R_PAD=triton.next_power_of_2(2 * gamma + 1),
                     SPLITS_PAD=partials_stride(plan.splits), PRECISE_MATH=precise, FAST=fast, FLAGS=False,
                     PDL=False, LEAN_SCAN=True, num_warps=4)
    rows = min(block // 4, RESAMPLE_ROWS)
    resample_args = (t.target_logits, t.draft_logits, t.target_temperature, t.draft_temperature, t.exponential_noise,
                     stop, stop_stats, block_best, offsets, seed, vocab, plan.splits,
                     t.target_logits.stride(0), t.target_logits.stride(1), t.draft_logits.stride(0),
                     t.draft_logits.stride(1), t.exponential_noise.stride(0))
    resample_meta = dict(GAMMA=gamma, BLOCK=block, ROWS=rows, PRECISE_MATH=precise, FAST=fast,
                         num_warps=4 if not INTERPRETED else 1)
    finish_args = (t.draft_tokens, t.target_logits, t.target_temperature, t.exponential_noise, stop, stop_stats,
                   block_best, outputs["accepted_lengths"], outputs["next_tokens"], outputs["output_tokens"], offsets,
                   seed, vocab, plan.splits, t.draft_tokens.stride(0), t.target_logits.stride(0),
                   t.target_logits.stride(1), t.exponential_noise.stride(0), outputs["output_tokens"].stride(0))
    finish_meta = dict(GAMMA=gamma, GAMMA_PAD=triton.next_power_of_2(gamma),
                       BLOCKS_PAD=triton.next_power_of_2(plan.splits), ROWS=min(rows, 512), PRECISE_MATH=precise,
                       FAST=fast, num_warps=4)
    launches = (
        stats_launch,
        BoundLaunch(_scan_kernel, (batch,), scan_args, scan_meta, device),
        BoundLaunch(_vllm_resample_kernel, (batch, plan.splits), resample_args, resample_meta, device),
        BoundLaunch(_vllm_finish_kernel, (batch,), finish_args, finish_meta, device),
    )

    def launch() -> None:
        for step in launches:
            step()

    launch.philox_offsets = offsets
    return launch
