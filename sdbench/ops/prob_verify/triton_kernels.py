"""Triton kernels for prob_verify (Leviathan rejection sampling) and their launchers.

Three designs, all reproducing `sdbench.reference.prob_verify` bit for bit on supplied randomness:

- flashspec (seed design, 3 launches): `_flashspec_verify_kernel` tests every (sequence, position)
  reading only the token id and the two scalars p, q; `_flashspec_gather_kernel` writes the accepted
  drafts and -1 at positions >= the first rejection; `_flashspec_sample_kernel` (one program per
  sequence) sweeps V once at the row where the sequence stopped and writes the next token.
- serial_sampler (the vLLM V1 random-path design, 2 launches): `_serial_recovered_kernel` draws a
  recovered token for EVERY position (γ+1 full-vocabulary sweeps per sequence), then
  `_serial_scan_kernel` (one program per sequence) scans the positions serially.
- fused (1 launch): `_fused_kernel`, grid (B, chunks). Program (b, c) owns one chunk of CHUNK
  columns: it draws (or loads) the race noise of its chunk while its sequence's γ-step acceptance
  scan is in flight (γ scalar pairs, L2-resident), reads its chunk of the stopping row only, and
  folds its best race key into a per-sequence 64-bit slot with atomic_max; the last program to
  arrive writes the outputs and resets the slot and the arrival counter. No loop over the row.

The exponential race. The next token is argmax_j w_j / E_j over w = max(0, p - q) (q := 0 at the
bonus row), E iid Exp(1): one pass, no normalising sum. Keys pack into one int64 so a single
atomic_max combines value and index: the high 32 bits are the float bits of the key (w / E where
w > 0, else -1.0: a non-negative float orders like its bits, and -1.0 is a negative int), the low
32 bits are 2^32-1-j (ties go to the smallest index, like torch.argmax). Every key with w > 0 packs
to >= 1, every other to < 0, and the slot resets to 0: a combined key <= 0 means w is 0 on the
whole row (impossible in exact arithmetic; a rounding guard, and unnormalised inputs), and the
race is rerun over p, as the reference does (`_fallback_race`, once, by the program that finishes).

Randomness. Supplied (FAST=False): uniforms [B, γ] and exponential noise [B, V] are read, and the
race divides with div_rn (IEEE, like PyTorch) so tokens match the reference exactly; log-probs are
decoded with libdevice's expf on CUDA (PyTorch's expf) and tl.exp under the interpreter. Fast
(FAST=True): Philox4x32-10 keyed by seed, with counter (index, sequence, offset, stream): stream 0
gives the accept uniform of (sequence, position), stream 1 the race noise: call j yields the four
uniforms of columns 4j..4j+3 (one 16-byte group), E = -log1p(-u) (libdevice on CUDA). The stream
is a function of the column alone, so the same seed and offset give the same tokens from fused and
flashspec, on any grid and any chunk size. The offset is read from a device counter per sequence
(int64 [B]) that the kernels advance by one per call (fused: its finalising program; flashspec: its
sample kernel), so repeated calls and graph replays draw fresh numbers without a host sync.

Bad input (sdbench.ops.input_contract): a draft token outside [0, V) is never loaded (masked: p = q
= 0, so it is rejected) and sets error_flags[b]; degenerate rows follow reference.prob_race's three
tiers (w > 0, then p > 0, then every column by 1 / E), so no token outside [0, V) is ever written.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from sdbench.ops.input_contract import TOKEN_OUT_OF_RANGE as _TOKEN_OUT_OF_RANGE

try:
    from triton.language.extra import libdevice
except ImportError:  # older Triton layouts
    from triton.language.extra.cuda import libdevice

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")  # triton.jit reads it at decoration time

GROUP = 4  # columns per Philox call, and per thread-contiguous group (16-byte float32 loads)
# Globals a jit function reads must be constexpr.
STREAM_ACCEPT = tl.constexpr(0)
STREAM_RACE = tl.constexpr(1)
TOKEN_OUT_OF_RANGE = tl.constexpr(_TOKEN_OUT_OF_RANGE)  # sdbench.ops.input_contract
SWEEP_ROWS = 512  # flashspec sample / serial recovered: 2048 columns per step, 4 warps (16 per thread)
SWEEP_WARPS = 4
# fused: chunk = columns per program, a power of two. The default plan takes the largest chunk up
# to CHUNK_MAX that still gives at least FUSED_PROGRAMS_PER_SM programs per SM in total, so small
# batches spread each row over ~one program per SM (b=1: latency) and large ones get 2048-column
# programs of 4 warps, 16 columns per thread (throughput: the per-program scan and reductions
# amortised over more columns). Measured on the H100 (docs/perf-notes.md): 4 warps x 16 columns
# beat 8 warps x 8 and 4 x 8 by 10-15% at b=32..128.
FUSED_PROGRAMS_PER_SM = 0.5
CHUNK_MIN = 16 if INTERPRETED else 256
CHUNK_MAX = 2048
MAX_WARPS = 4


# --- shared device helpers ---------------------------------------------------------------------
@triton.jit
def _decode(values, LOGPROBS: tl.constexpr, PRECISE_MATH: tl.constexpr):
    """Stored p or q -> float32 probability."""
    values = values.to(tl.float32)
    if LOGPROBS:
        if PRECISE_MATH:
            values = libdevice.exp(values)  # expf, as PyTorch computes it: identical tokens
        else:
            values = tl.exp(values)
    return values


@triton.jit
def _load_probs(row, cols, limit, LOGPROBS: tl.constexpr, PRECISE_MATH: tl.constexpr):
    """Probabilities at cols of one stored row; 0 at cols >= limit (never read)."""
    inside = cols < limit
    values = _decode(tl.load(row + cols, mask=inside, other=0.0), LOGPROBS, PRECISE_MATH)
    if LOGPROBS:
        values = tl.where(inside, values, 0.0)  # a masked log-prob of 0 would decode to 1
    return values


@triton.jit
def _exponential(uniform, PRECISE_MATH: tl.constexpr):
    """E = -log(1 - u) ~ Exp(1), accurate to a few ulp over the whole range.

    The race is decided by the smallest E/w, so small E must keep its relative accuracy: u has
    fine resolution near 0 (k·2^-31), which -log1p(-u) preserves, whereas -log(u) would take small E
    from u near 1, where float32 steps are 2^-24 and an approximate log is off by ~1e-7 absolute.
    On CUDA (PRECISE_MATH), two branch-free pieces instead of libdevice's log1pf (half the
    instructions, and this runs once per vocabulary entry): u < 1/4: E = 2·atanh(s) with
    s = u / (2 - u) <= 1/7, odd series to s^9 (truncation < 1e-9 relative); u >= 1/4: 1 - u is
    exact to 2^-25 and -ln(1 - u) >= 0.28, so the hardware log2 (MUFU.LG2, ~2^-22 absolute) keeps
    ~5e-7 relative (measured on the H100: at most 5.2e-7 over 3.5e7 values of u). Clamped to FLT_MIN so that u = 0 (probability 2^-31) gives a huge finite key,
    never 0/0."""
    if PRECISE_MATH:
        s = libdevice.fast_dividef(uniform, 2.0 - uniform)
        s2 = s * s
        series = s * (2.0 + s2 * (0.6666666666666666 + s2 * (0.4 + s2 * (0.2857142857142857 + s2 * 0.2222222222222222))))
        exponential = tl.where(uniform < 0.25, series, -0.6931471805599453 * libdevice.fast_log2f(1.0 - uniform))
    else:
        complement = 1.0 - uniform  # log1p from log (Goldberg): u / (1 - complement) corrects the rounding
        rounded = tl.where(complement == 1.0, 1.0, 1.0 - complement)
        exponential = tl.where(complement == 1.0, uniform, -tl.log(complement) * uniform / rounded)
    return tl.maximum(exponential, 1.1754943508222875e-38)


@triton.jit
def _fast_divide(numerator, denominator, PRECISE_MATH: tl.constexpr):
    """numerator / denominator for fast-mode race keys, where no reference fixes the rounding: the
    hardware reciprocal and a multiply on CUDA (div.approx, ~2 ulp; the denominators here are in
    [FLT_MIN, 2^126)), the plain division elsewhere."""
    if PRECISE_MATH:
        return libdevice.fast_dividef(numerator, denominator)
    else:
        return numerator / denominator


@triton.jit
def _philox_uniforms(seed, offset, sequence, counter, STREAM: tl.constexpr):
    """Four float32 uniforms in [0, 1) per element, keyed by (counter, sequence, offset, STREAM)."""
    c0 = counter.to(tl.uint32)
    c1 = sequence.to(tl.uint32)
    c0, c1 = tl.broadcast(c0, c1)
    c2 = tl.zeros_like(c0) + offset.to(tl.uint32)
    c3 = tl.full(c0.shape, STREAM, tl.uint32)
    r0, r1, r2, r3 = tl.philox(seed, c0, c1, c2, c3)
    return (tl.uint_to_uniform_float(r0), tl.uint_to_uniform_float(r1),
            tl.uint_to_uniform_float(r2), tl.uint_to_uniform_float(r3))


@triton.jit
def _accept_uniforms(uniforms_ptr, b, positions, valid, stride_u_b, seed, offset, FAST: tl.constexpr):
    """The accept-test uniform of (sequence b, position) for each lane."""
    if FAST:
        u, _, _, _ = _philox_uniforms(seed, offset, b, positions, STREAM_ACCEPT)
    else:
        u = tl.load(uniforms_ptr + b * stride_u_b + positions, mask=valid, other=0.0)
    return u


@triton.jit
def _chunk_columns(start, ROWS: tl.constexpr):
    """[ROWS, GROUP] column ids start + GROUP·row + lane: each row is one 16-byte group of a thread."""
    return start + tl.arange(0, ROWS)[:, None] * 4 + tl.arange(0, 4)[None, :]


@triton.jit
def _race_noise(noise_row, b, start, cols, vocab, seed, offset,
                ROWS: tl.constexpr, PRECISE_MATH: tl.constexpr, FAST: tl.constexpr):
    """E [ROWS, GROUP] at cols = _chunk_columns(start, ROWS): loaded (supplied) or drawn (fast,
    one Philox call per group of 4 columns, counter = column // 4). Depends on no draft data, so
    a kernel can compute it while its acceptance scan is in flight."""
    if FAST:
        group = start // 4 + tl.arange(0, ROWS)[:, None]
        u0, u1, u2, u3 = _philox_uniforms(seed, offset, b, group, STREAM_RACE)
        lane = tl.arange(0, 4)[None, :]
        uniform = tl.where(lane == 0, u0, tl.where(lane == 1, u1, tl.where(lane == 2, u2, u3)))
        noise = _exponential(uniform, PRECISE_MATH)
    else:
        noise = tl.load(noise_row + cols, mask=cols < vocab, other=1.0)
    return noise


@triton.jit
def _pack(key, cols):
    """int64 race key: high word = the float bits of key made monotonic (a negative float's magnitude
    bits flipped, so -E orders like -E and not like E), sign-extended; low word = 2^32-1-col."""
    bits = key.to(tl.int32, bitcast=True)
    high = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(tl.int64)
    low = (~cols).to(tl.uint32, bitcast=True).to(tl.int64)
    return (high << 32) | low


@triton.jit
def _token_of(packed):
    return (~packed).to(tl.uint32).to(tl.int64)  # = 2^32-1 - low word


@triton.jit
def _residual_keys(target_row, draft_row, noise, has_draft, cols, vocab,
                   LOGPROBS: tl.constexpr, PRECISE_MATH: tl.constexpr, FAST: tl.constexpr):
    """Packed residual race keys at cols: w / E where w = p - q > 0 (q := 0 at the bonus row), else
    -1.0 (masked columns too: p = q = 0 there)."""
    target = _load_probs(target_row, cols, vocab, LOGPROBS, PRECISE_MATH)
    # cols < (V or 0), not valid & has_draft: the interpreter mistypes a vector & scalar-bool mask
    draft = _load_probs(draft_row, cols, tl.where(has_draft, vocab, 0), LOGPROBS, PRECISE_MATH)
    residual = target - draft  # = max(0, p - q) wherever it is positive, bit for bit
    if FAST:
        key = _fast_divide(residual, noise, PRECISE_MATH)  # ~2 ulp, no reference to match
    else:
        key = tl.math.div_rn(residual, noise)  # IEEE division: the same bits as PyTorch's w / E
    return _pack(tl.where(residual > 0, key, -1.0), cols)


@triton.jit
def _fallback_race(target_row, noise_row, b, vocab, seed, offset,
                   ROWS: tl.constexpr, LOGPROBS: tl.constexpr, PRECISE_MATH: tl.constexpr, FAST: tl.constexpr):
    """Tiers 2 and 3 of the degenerate-row rule (reference.prob_race), packed, over the whole row: the
    race when w is 0 everywhere. Key p / E where p > 0 (>= 0), else -E (< 0: the first index of the
    smallest E wins when p has no positive entry); -inf past V, so a padding column never wins."""
    best = tl.full([ROWS, 4], -9223372036854775808, tl.int64)
    for start in range(0, vocab, 4 * ROWS):
        cols = _chunk_columns(start, ROWS)
        noise = _race_noise(noise_row, b, start, cols, vocab, seed, offset, ROWS, PRECISE_MATH, FAST)
        target = _load_probs(target_row, cols, vocab, LOGPROBS, PRECISE_MATH)
        if FAST:
            key = _fast_divide(target, noise, PRECISE_MATH)
        else:
            key = tl.math.div_rn(target, noise)
        key = tl.where(target > 0, key, -noise)
        key = tl.where(cols < vocab, key, float("-inf"))
        best = tl.maximum(best, _pack(key, cols))
    return tl.max(tl.max(best, axis=1), axis=0)


@triton.jit
def _probs_at_tokens(row_ptrs, tokens, readable, LOGPROBS: tl.constexpr, PRECISE_MATH: tl.constexpr):
    """p or q at the draft tokens; 0 where not readable (out of the draft, or a token outside [0, V):
    the input contract's p = q = 0, so the token is rejected and nothing outside the row is read)."""
    values = _decode(tl.load(row_ptrs + tokens, mask=readable, other=0.0), LOGPROBS, PRECISE_MATH)
    return tl.where(readable, values, 0.0)  # a masked log-prob of 0 would decode to 1


@triton.jit
def _race_row(target_row, draft_row, noise_row, has_draft, b, vocab, seed, offset,
              ROWS: tl.constexpr, LOGPROBS: tl.constexpr, PRECISE_MATH: tl.constexpr, FAST: tl.constexpr):
    """The next token of one sequence: the residual race over the whole row by one program."""
    best = tl.full([ROWS, 4], -1, tl.int64)
    for start in range(0, vocab, 4 * ROWS):
        cols = _chunk_columns(start, ROWS)
        noise = _race_noise(noise_row, b, start, cols, vocab, seed, offset, ROWS, PRECISE_MATH, FAST)
        best = tl.maximum(best, _residual_keys(target_row, draft_row, noise, has_draft, cols, vocab,
                                               LOGPROBS, PRECISE_MATH, FAST))
    winner = tl.max(tl.max(best, axis=1), axis=0)
    if winner <= 0:
        winner = _fallback_race(target_row, noise_row, b, vocab, seed, offset, ROWS, LOGPROBS, PRECISE_MATH, FAST)
    return _token_of(winner)


@triton.jit
def _write_outputs(draft_tokens_ptr, accepted_lengths_ptr, next_tokens_ptr, output_tokens_ptr, b, k, next_token,
                   stride_tok_b, stride_out_b, GAMMA: tl.constexpr, OUT_PAD: tl.constexpr):
    """output_tokens[b] = accepted drafts, the next token at k, -1 after; plus next_tokens, lengths."""
    cols = tl.arange(0, OUT_PAD)
    drafts = tl.load(draft_tokens_ptr + b * stride_tok_b + cols, mask=cols < GAMMA, other=0).to(tl.int64)
    row = tl.where(cols < k, drafts, tl.where(cols == k, next_token, -1))
    tl.store(output_tokens_ptr + b * stride_out_b + cols, row.to(output_tokens_ptr.dtype.element_ty), mask=cols <= GAMMA)
    tl.store(next_tokens_ptr + b, next_token.to(next_tokens_ptr.dtype.element_ty))
    tl.store(accepted_lengths_ptr + b, k.to(tl.int64))


# --- fused: one launch, one chunk per program, atomic combine ----------------------------------
# The combine, shared with prob_verify_ragged's fused kernel: every program of sequence b folds its key
# into best[b] and arrives; the last to arrive takes the winner and resets the scratch.
@triton.jit
def _arrive(keys, best_ptr, arrivals_ptr, b, chunks):
    """Fold this program's best packed key into best[b] (relaxed atomic_max), then count its arrival
    (acq_rel: orders the max before it and, in the last program, every other program's max before
    what follows). True in the last program of b to arrive."""
    tl.atomic_max(best_ptr + b, tl.max(tl.max(keys, axis=1), axis=0), sem="relaxed")
    arrived = tl.atomic_add(arrivals_ptr + b, 1, sem="acq_rel")
    return arrived == chunks - 1


@triton.jit
def _race_winner(best_ptr, target_row, noise_row, b, vocab, seed, offset,
                 ROWS: tl.constexpr, LOGPROBS: tl.constexpr, PRECISE_MATH: tl.constexpr, FAST: tl.constexpr):
    """The last arrival's next token: the combined key, read and reset to 0 in one atomic_xchg; the race
    rerun over p (tiers 2 and 3) when w was 0 on the whole row (never, on real distributions)."""
    winner = tl.atomic_xchg(best_ptr + b, 0, sem="relaxed")
    if winner <= 0:
        winner = _fallback_race(target_row, noise_row, b, vocab, seed, offset, ROWS, LOGPROBS, PRECISE_MATH, FAST)
    return _token_of(winner)


@triton.jit
def _release(arrivals_ptr, offsets_ptr, b, offset, FAST: tl.constexpr):
    """The last arrival's exit: fast mode's offset + 1 for the next call (every program of b read it before
    arriving), and the arrival counter back to 0 (every program of b has arrived: nothing else touches it
    this launch), so the next launch or graph replay starts clean."""
    if FAST:
        tl.store(offsets_ptr + b, offset + 1)
    tl.store(arrivals_ptr + b, 0)


@triton.jit(do_not_specialize=["seed"])
def _fused_kernel(
    draft_tokens_ptr, target_ptr, draft_ptr, uniforms_ptr, noise_ptr,
    accepted_lengths_ptr, next_tokens_ptr, output_tokens_ptr, error_flags_ptr, best_ptr, arrivals_ptr, offsets_ptr,
    seed, vocab, chunks,
    stride_tok_b, stride_p_b, stride_p_row, stride_q_b, stride_q_row, stride_u_b, stride_e_b, stride_out_b,
    GAMMA: tl.constexpr, GAMMA_PAD: tl.constexpr, ROWS: tl.constexpr,
    LOGPROBS: tl.constexpr, PRECISE_MATH: tl.constexpr, FAST: tl.constexpr,
):
    """Grid (B, chunks). Program (b, c) owns columns [c·CHUNK, (c+1)·CHUNK), CHUNK = 4·ROWS, as
    [ROWS, 4] groups (4 contiguous columns per thread and row: 16-byte loads in float32).

    Order matters for latency, every step being a dependent memory round trip: (1) issue the γ
    token-id loads; (2) while they fly, draw (or load) the chunk's race noise, which needs no draft
    data; (3) gather p, q at the tokens and find k, the first rejection; (4) load the chunk of row k
    (p and q, or p alone at the bonus row) and reduce to one packed key; (5) atomic_max it into
    best[b] (relaxed), then atomic_add(arrivals[b]) (acq_rel: orders the max before it and, in the
    last program, every other program's max before what follows); (6) the last arrival takes the
    winner with atomic_xchg(best[b], 0), reruns the race over p if w was 0 on the whole row (never,
    on real distributions), and writes the outputs from the scan's registers. best_ptr (int64 [B])
    and arrivals_ptr (int32 [B]) must start zeroed; each launch leaves them zeroed, so CUDA-graph
    replays start clean.

    Fast mode reads the Philox offset from offsets_ptr[b] (int64 [B]) and the last arrival writes
    offset + 1 there: every program of b read it before its acq_rel arrival, so the next call (or
    graph replay) draws fresh numbers with no host involvement. error_flags[b] (int32) is written by
    the last arrival: TOKEN_OUT_OF_RANGE where a draft token is outside [0, V) (sdbench.ops.input_contract).
    """
    b = tl.program_id(0).to(tl.int64)
    start = tl.program_id(1) * (4 * ROWS)
    cols = _chunk_columns(start, ROWS)
    if FAST:
        offset = tl.load(offsets_ptr + b)
    else:
        offset = 0

    positions = tl.arange(0, GAMMA_PAD)
    in_draft = positions < GAMMA
    tokens = tl.load(draft_tokens_ptr + b * stride_tok_b + positions, mask=in_draft, other=0).to(tl.int64)
    out_of_range = in_draft & ((tokens < 0) | (tokens >= vocab))
    readable = in_draft & ~out_of_range
    noise_row = noise_ptr + b * stride_e_b
    noise = _race_noise(noise_row, b, start, cols, vocab, seed, offset, ROWS, PRECISE_MATH, FAST)

    p = _probs_at_tokens(target_ptr + b * stride_p_b + positions * stride_p_row, tokens, readable, LOGPROBS, PRECISE_MATH)
    q = _probs_at_tokens(draft_ptr + b * stride_q_b + positions * stride_q_row, tokens, readable, LOGPROBS, PRECISE_MATH)
    u = _accept_uniforms(uniforms_ptr, b, positions, in_draft, stride_u_b, seed, offset, FAST)
    rejected = in_draft & ~(u * q < p)
    k = tl.min(tl.where(rejected, positions, GAMMA), axis=0)

    has_draft = k < GAMMA
    target_row = target_ptr + b * stride_p_b + k * stride_p_row
    draft_row = draft_ptr + b * stride_q_b + tl.minimum(k, GAMMA - 1) * stride_q_row
    keys = _residual_keys(target_row, draft_row, noise, has_draft, cols, vocab, LOGPROBS, PRECISE_MATH, FAST)
    last = _arrive(keys, best_ptr, arrivals_ptr, b, chunks)
    if last:
        next_token = _race_winner(best_ptr, target_row, noise_row, b, vocab, seed, offset,
                                  ROWS, LOGPROBS, PRECISE_MATH, FAST)
        out_row = output_tokens_ptr + b * stride_out_b
        out_type = output_tokens_ptr.dtype.element_ty
        drafts = tl.where(positions < k, tokens, tl.where(positions == k, next_token, -1))
        tl.store(out_row + positions, drafts.to(out_type), mask=in_draft)
        tl.store(out_row + GAMMA, tl.where(has_draft, -1, next_token).to(out_type))
        tl.store(next_tokens_ptr + b, next_token.to(next_tokens_ptr.dtype.element_ty))
        tl.store(accepted_lengths_ptr + b, k.to(tl.int64))
        tl.store(error_flags_ptr + b, tl.max(out_of_range.to(tl.int32), axis=0) * TOKEN_OUT_OF_RANGE)
        _release(arrivals_ptr, offsets_ptr, b, offset, FAST)


# --- flashspec: verify (scalars only) + gather + sample ------------------------------------------
@triton.jit(do_not_specialize=["seed"])
def _flashspec_verify_kernel(
    draft_tokens_ptr, target_ptr, draft_ptr, uniforms_ptr, accepted_ptr, accept_probs_ptr, offsets_ptr,
    batch, seed, vocab,
    stride_tok_b, stride_p_b, stride_p_row, stride_q_b, stride_q_row, stride_u_b,
    GAMMA: tl.constexpr, LOGPROBS: tl.constexpr, PRECISE_MATH: tl.constexpr, FAST: tl.constexpr,
    BLOCK_B: tl.constexpr,
):
    """Grid (⌈B/BLOCK_B⌉, γ). Program (j, i): sequences [j·BLOCK_B, (j+1)·BLOCK_B) at position i
    read their token id, p and q at it and the uniform, and write the accept flag (int8 [B, γ]: 1
    accepted, 0 rejected, -1 rejected because the token is outside [0, V)) and accept_probs =
    min(1, p/q) (float32 [B, γ]). Never touches the vocabulary beyond one element. Fast mode reads
    the Philox offset of each sequence from offsets_ptr (the sample kernel advances it)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_B + tl.arange(0, BLOCK_B)
    position = tl.program_id(1)
    valid = rows < batch
    if FAST:
        offset = tl.load(offsets_ptr + rows, mask=valid, other=0)
    else:
        offset = 0
    tokens = tl.load(draft_tokens_ptr + rows * stride_tok_b + position, mask=valid, other=0).to(tl.int64)
    out_of_range = valid & ((tokens < 0) | (tokens >= vocab))
    readable = valid & ~out_of_range
    p = _probs_at_tokens(target_ptr + rows * stride_p_b + position * stride_p_row, tokens, readable,
                         LOGPROBS, PRECISE_MATH)
    q = _probs_at_tokens(draft_ptr + rows * stride_q_b + position * stride_q_row, tokens, readable,
                         LOGPROBS, PRECISE_MATH)
    u = _accept_uniforms(uniforms_ptr, rows, position, valid, stride_u_b, seed, offset, FAST)
    accepted = u * q < p
    safe_q = tl.where(q > 0, q, 1.0)
    ratio = tl.math.div_rn(p, safe_q)
    ratio = tl.minimum(tl.where(ratio > 0, ratio, 0.0), 1.0)  # negative or NaN: the test never passes
    accept_prob = tl.where(q > 0, ratio, tl.where(p > 0, 1.0, 0.0))
    flag = tl.where(out_of_range, -1, accepted.to(tl.int32))
    tl.store(accepted_ptr + rows * GAMMA + position, flag.to(tl.int8), mask=valid)
    tl.store(accept_probs_ptr + rows * GAMMA + position, accept_prob, mask=valid)


@triton.jit
def _flashspec_gather_kernel(
    draft_tokens_ptr, accepted_ptr, accepted_lengths_ptr, output_tokens_ptr, error_flags_ptr,
    total, stride_tok_b, stride_out_b,
    GAMMA: tl.constexpr, GAMMA_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):
    """Grid ⌈B·γ/BLOCK_SIZE⌉ over the flattened (sequence, position) pairs: each lane finds its
    sequence's first rejection k from the γ accept flags ([BLOCK_SIZE, GAMMA_PAD] int8 tile) and
    writes the draft token at positions < k, -1 at positions >= k (the sample kernel then writes the
    next token at k and column γ); position-0 lanes write accepted_lengths and error_flags (a flag of
    -1 marks a token outside [0, V))."""
    flat = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    valid = flat < total
    rows = flat // GAMMA
    position = flat % GAMMA
    positions = tl.arange(0, GAMMA_PAD)
    in_draft = valid[:, None] & (positions[None, :] < GAMMA)
    flags = tl.load(accepted_ptr + rows[:, None] * GAMMA + positions[None, :], mask=in_draft, other=1)
    k = tl.min(tl.where(in_draft & (flags <= 0), positions[None, :], GAMMA), axis=1)
    out_of_range = tl.max((in_draft & (flags < 0)).to(tl.int32), axis=1)
    drafts = tl.load(draft_tokens_ptr + rows * stride_tok_b + position, mask=valid, other=0)
    out = tl.where(position < k, drafts, -1)
    tl.store(output_tokens_ptr + rows * stride_out_b + position, out.to(output_tokens_ptr.dtype.element_ty), mask=valid)
    tl.store(accepted_lengths_ptr + rows, k.to(tl.int64), mask=valid & (position == 0))
    tl.store(error_flags_ptr + rows, out_of_range * TOKEN_OUT_OF_RANGE, mask=valid & (position == 0))


@triton.jit(do_not_specialize=["seed"])
def _flashspec_sample_kernel(
    target_ptr, draft_ptr, noise_ptr, accepted_lengths_ptr, next_tokens_ptr, output_tokens_ptr, offsets_ptr,
    seed, vocab,
    stride_p_b, stride_p_row, stride_q_b, stride_q_row, stride_e_b, stride_out_b,
    GAMMA: tl.constexpr, OUT_PAD: tl.constexpr, ROWS: tl.constexpr,
    LOGPROBS: tl.constexpr, PRECISE_MATH: tl.constexpr, FAST: tl.constexpr,
):
    """Grid (B,). One program sweeps all of row k = accepted_lengths[b] (one pass, running max of the
    packed race keys) and writes next_tokens[b], output_tokens[b, k] and output_tokens[b, γ]. Fast mode:
    the last of the three launches to read offsets_ptr[b], so it advances it by one (stream order)."""
    b = tl.program_id(0).to(tl.int64)
    if FAST:
        offset = tl.load(offsets_ptr + b)
    else:
        offset = 0
    k = tl.load(accepted_lengths_ptr + b).to(tl.int32)
    has_draft = k < GAMMA
    target_row = target_ptr + b * stride_p_b + k * stride_p_row
    draft_row = draft_ptr + b * stride_q_b + tl.minimum(k, GAMMA - 1) * stride_q_row
    next_token = _race_row(target_row, draft_row, noise_ptr + b * stride_e_b, has_draft, b, vocab, seed, offset,
                           ROWS, LOGPROBS, PRECISE_MATH, FAST)
    tl.store(next_tokens_ptr + b, next_token.to(next_tokens_ptr.dtype.element_ty))
    cols = tl.arange(0, OUT_PAD)
    tail = tl.where(cols == k, next_token, -1)
    tl.store(output_tokens_ptr + b * stride_out_b + cols, tail.to(output_tokens_ptr.dtype.element_ty),
             mask=(cols == k) | (cols == GAMMA))
    if FAST:
        tl.store(offsets_ptr + b, offset + 1)


# --- serial_sampler: recovered token for every position, then a serial scan ----------------------
@triton.jit
def _serial_recovered_kernel(
    target_ptr, draft_ptr, noise_ptr, recovered_ptr, vocab,
    stride_p_b, stride_p_row, stride_q_b, stride_q_row, stride_e_b,
    GAMMA: tl.constexpr, ROWS: tl.constexpr, LOGPROBS: tl.constexpr, PRECISE_MATH: tl.constexpr,
):
    """Grid (B, γ+1). Program (b, i) sweeps the whole vocabulary at row i (residual p_i - q_i, or p_γ
    at i = γ) with the sequence's noise row and writes recovered[b, i]: γ+1 full sweeps per
    sequence, of which the scan uses one."""
    b = tl.program_id(0).to(tl.int64)
    position = tl.program_id(1)
    has_draft = position < GAMMA
    target_row = target_ptr + b * stride_p_b + position * stride_p_row
    draft_row = draft_ptr + b * stride_q_b + tl.minimum(position, GAMMA - 1) * stride_q_row
    token = _race_row(target_row, draft_row, noise_ptr + b * stride_e_b, has_draft, b, vocab, 0, 0,
                      ROWS, LOGPROBS, PRECISE_MATH, False)
    tl.store(recovered_ptr + b * (GAMMA + 1) + position, token)


@triton.jit
def _serial_scan_kernel(
    draft_tokens_ptr, target_ptr, draft_ptr, uniforms_ptr, recovered_ptr,
    accepted_lengths_ptr, next_tokens_ptr, output_tokens_ptr, error_flags_ptr, vocab,
    stride_tok_b, stride_p_b, stride_p_row, stride_q_b, stride_q_row, stride_u_b, stride_out_b,
    GAMMA: tl.constexpr, OUT_PAD: tl.constexpr, LOGPROBS: tl.constexpr, PRECISE_MATH: tl.constexpr,
):
    """Grid (B,). One program walks positions 0..γ-1 one scalar at a time until the first rejection,
    then takes the recovered token there (or the bonus at γ) and writes the outputs. A token outside
    [0, V) is read as p = q = 0 (rejected) and flagged in error_flags[b], from all γ tokens."""
    b = tl.program_id(0).to(tl.int64)
    k = tl.program_id(0) * 0 + GAMMA  # a runtime int32 scalar, carried through the loop
    for position in range(0, GAMMA):
        if k == GAMMA:
            token = tl.load(draft_tokens_ptr + b * stride_tok_b + position).to(tl.int64)
            readable = (token >= 0) & (token < vocab)
            p = _probs_at_tokens(target_ptr + b * stride_p_b + position * stride_p_row, token, readable,
                                 LOGPROBS, PRECISE_MATH)
            q = _probs_at_tokens(draft_ptr + b * stride_q_b + position * stride_q_row, token, readable,
                                 LOGPROBS, PRECISE_MATH)
            u = tl.load(uniforms_ptr + b * stride_u_b + position)
            k = tl.where(u * q < p, k, position)
    cols = tl.arange(0, OUT_PAD)
    tokens = tl.load(draft_tokens_ptr + b * stride_tok_b + cols, mask=cols < GAMMA, other=0)
    out_of_range = (cols < GAMMA) & ((tokens < 0) | (tokens >= vocab))
    tl.store(error_flags_ptr + b, tl.max(out_of_range.to(tl.int32), axis=0) * TOKEN_OUT_OF_RANGE)
    next_token = tl.load(recovered_ptr + b * (GAMMA + 1) + k)
    _write_outputs(draft_tokens_ptr, accepted_lengths_ptr, next_tokens_ptr, output_tokens_ptr, b, k, next_token,
                   stride_tok_b, stride_out_b, GAMMA, OUT_PAD)


# --- autotuning (compiled mode only: the interpreter has no benchmarker) ------------------------
_VERIFY_CONFIGS = [triton.Config({"BLOCK_B": block}, num_warps=warps) for block, warps in ((1, 1), (2, 2), (4, 4), (8, 4))]
_GATHER_CONFIGS = [triton.Config({"BLOCK_SIZE": size}, num_warps=warps)
                   for size, warps in ((64, 1), (128, 1), (256, 2), (512, 4))]
_flashspec_verify_tuned = triton.autotune(_VERIFY_CONFIGS, key=["batch", "GAMMA"])(_flashspec_verify_kernel)
_flashspec_gather_tuned = triton.autotune(_GATHER_CONFIGS, key=["total", "GAMMA"])(_flashspec_gather_kernel)
INTERPRETER_BLOCK_B = 2  # fixed configs under the interpreter (small, so masking is exercised)
INTERPRETER_BLOCK_SIZE = 64


# --- launchers ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class ProbTensors:
    """The inputs of one prob_verify call as the kernels see them (last dimensions contiguous)."""

    draft_tokens: torch.Tensor  # [B, γ]
    target_probs: torch.Tensor  # [B, γ+1, V]
    draft_probs: torch.Tensor  # [B, γ, V]
    uniforms: torch.Tensor  # [B, γ] float32 (read in supplied mode only)
    exponential_noise: torch.Tensor  # [B, V] float32 (read in supplied mode only)
    logprobs: bool

    @property
    def shape(self) -> tuple[int, int, int]:
        batch, gamma = self.draft_tokens.shape
        return batch, gamma, self.target_probs.shape[2]

    def check(self) -> None:
        for name in ("draft_tokens", "target_probs", "draft_probs", "uniforms", "exponential_noise"):
            tensor = getattr(self, name)
            if tensor.stride(-1) != 1:
                raise ValueError(f"{name} needs a contiguous last dimension (call .contiguous())")


@dataclass(frozen=True)
class FusedPlan:
    """How the fused kernel splits each sequence's vocabulary sweep: one chunk per program."""

    chunk: int  # columns per program (a power of two, a multiple of GROUP)
    splits: int  # programs per sequence = ⌈V / chunk⌉
    num_warps: int

    @property
    def rows(self) -> int:
        return self.chunk // GROUP


def fused_plan(batch: int, vocab: int, target_programs: int, chunk_min: int | None = None,
               chunk_max: int = CHUNK_MAX) -> FusedPlan:
    """The largest power-of-two chunk in [chunk_min, chunk_max] that still gives B·⌈V/chunk⌉ >=
    target_programs (the smallest chunk when none does); warps = chunk / 128 within [1, MAX_WARPS],
    i.e. 4 columns per thread up to 512 columns, then 4 warps with 8 (1024) or 16 (2048) per thread."""
    chunk_min = CHUNK_MIN if chunk_min is None else chunk_min
    chunk = chunk_max
    while chunk > chunk_min and batch * triton.cdiv(vocab, chunk) < target_programs:
        chunk //= 2
    warps = max(1, min(MAX_WARPS, chunk // (32 * GROUP)))
    return FusedPlan(chunk=chunk, splits=triton.cdiv(vocab, chunk), num_warps=warps)


def default_fused_plan(batch: int, vocab: int, device: torch.device, chunk_max: int = CHUNK_MAX) -> FusedPlan:
    if device.type == "cuda":
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        return fused_plan(batch, vocab, max(1, int(FUSED_PROGRAMS_PER_SM * sms)), chunk_max=chunk_max)
    return fused_plan(batch, vocab, 4 * batch)  # the interpreter: a few splits, to exercise the combine


def _precise_math(device: torch.device) -> bool:
    return device.type == "cuda" and not INTERPRETED


def philox_offsets(batch: int, offset: int, device: torch.device) -> torch.Tensor:
    """The fast-mode offset counters: int64 [B], every sequence at offset. The kernels read them and
    advance them by one per call on the device (so timed calls and graph replays draw fresh numbers
    without a host sync); Philox uses the low 32 bits."""
    return torch.full((batch,), offset, dtype=torch.int64, device=device)


Launch = Callable[[], None]


def _hook_calls(hook) -> list | tuple:
    """The callables a Triton launch hook would run: triton >= 3.5 keeps a HookChain (its `calls`
    list, empty by default, and the same list object for the life of the process); older versions a
    plain callable or None."""
    if hook is None:
        return ()
    calls = getattr(hook, "calls", None)
    return calls if isinstance(calls, list) else [hook]


def resident_programs(registers: int, warps: int, shared: int, props) -> int:
    """Programs (thread blocks) of `warps` warps one SM holds at once, by CUDA's occupancy rule on sm_80/sm_90:
    registers go to warps in units of 256 from the SM's four equal partitions (a warp's partition holds
    ⌊file/4 / per-warp⌋ warps), at most max_threads/32 warps and 32 blocks, and each block's shared memory
    plus the 1 KB the runtime reserves per block."""
    per_warp = -(-max(1, registers) * 32 // 256) * 256
    partition = getattr(props, "regs_per_multiprocessor", 65536) // 4
    warps_by_registers = 4 * (partition // per_warp)
    threads = getattr(props, "max_threads_per_multi_processor", 2048)
    shared_per_sm = getattr(props, "shared_memory_per_multiprocessor", 233472)
    by_shared = shared_per_sm // (shared + 1024)
    return max(1, min(warps_by_registers // warps, threads // (32 * warps), 32, by_shared))


class BoundLaunch:
    """`kernel[grid](*args, **meta)` as a zero-argument call that, after its first (compiling) call,
    skips Triton's Python launcher.

    JITFunction.run binds and specialises every argument, hashes a cache key, looks the kernel up and
    builds launch metadata on each call, and the compiled launcher then calls `data_ptr()` and
    cuPointerGetAttribute for every tensor: tens of µs of host time per launch on the H100 host. The
    first call goes through JITFunction.run, which returns the CompiledKernel; later calls hand the
    same arguments (tensors as raw device pointers, bound here once) straight to that kernel's
    launcher (`CompiledKernel.run`, the call JITFunction.run itself ends with) on the current stream,
    so CUDA-graph capture still records them. The ordinary path is kept when the first call returns
    no CompiledKernel (the interpreter) and, call by call, while a Triton launch hook is installed
    (`triton.knobs.runtime.launch_enter_hook` / `launch_exit_hook`: Proton and similar profilers,
    which the direct path would bypass). The bound tensors must stay the launch's arguments for its
    whole life (prepare binds them once and keeps them).
    """

    def __init__(self, kernel, grid: tuple[int, ...], args: tuple, meta: dict, device: torch.device) -> None:
        self._kernel, self._grid, self._args, self._meta = kernel, grid, args, meta
        self._device_index = device.index if device.index is not None else (
            torch.cuda.current_device() if device.type == "cuda" else 0)
        self._direct: Launch | None = None
        self.direct_reason: str | None = "not launched yet"

    def _slow(self):
        return self._kernel[self._grid](*self._args, **self._meta)

    def __call__(self) -> None:
        if self._direct is not None:
            self._direct()
            return
        compiled = self._slow()
        if self.direct_reason == "not launched yet":
            self._direct, self.direct_reason = self._bind(compiled)

    def programs_per_sm(self) -> int | None:
        """How many of this launch's programs one SM holds at once, from the compiled kernel's registers, warps
        and shared memory (compiling it now if it is not yet: Triton caches it for the first call), or None
        where there is no compiled kernel (the interpreter). Plans sized by it fill whole waves of the kernel
        as it compiled, not a guess at its registers."""
        if INTERPRETED:
            return None
        compiled = self._kernel.warmup(*self._args, grid=self._grid, **self._meta)
        if compiled is None or not hasattr(compiled, "_init_handles"):
            return None
        compiled._init_handles()  # loads the module: n_regs comes from the driver
        registers = getattr(compiled, "n_regs", None)
        if not registers:
            return None
        return resident_programs(registers, compiled.metadata.num_warps, compiled.metadata.shared,
                                 torch.cuda.get_device_properties(self._device_index))

    def _bind(self, compiled) -> tuple[Launch | None, str | None]:
        needed = ("run", "function", "packed_metadata")
        if compiled is None or not all(hasattr(compiled, name) for name in needed):
            return None, "no CompiledKernel (interpreter)"
        try:
            from triton import knobs

            enter_calls = _hook_calls(knobs.runtime.launch_enter_hook)
            exit_calls = _hook_calls(knobs.runtime.launch_exit_hook)
        except (ImportError, AttributeError):  # older Triton: no knobs, no hooks to honour
            enter_calls, exit_calls = (), ()
        names = list(self._kernel.arg_names)
        values = list(self._args) + [self._meta[name] for name in names[len(self._args):]]
        if len(values) != len(names):
            return None, f"argument count {len(values)} != {len(names)}"
        values = [value.data_ptr() if isinstance(value, torch.Tensor) else value for value in values]
        run = compiled.run  # the compiled launcher (loads the module on first access)
        if getattr(run, "global_scratch_size", 0) or getattr(run, "profile_scratch_size", 0):
            return None, "the kernel needs launcher-allocated scratch"
        function, packed = compiled.function, compiled.packed_metadata
        grid_x, grid_y, grid_z = tuple(self._grid) + (1,) * (3 - len(self._grid))
        current_stream = torch._C._cuda_getCurrentRawStream
        device_index = self._device_index
        arguments = tuple(values)
        slow = self._slow

        def direct() -> None:
            if enter_calls or exit_calls:  # a hook was installed after binding: let Triton run it
                slow()
                return
            run(grid_x, grid_y, grid_z, current_stream(device_index), function, packed, None, None, None, *arguments)

        return direct, None


def fused_launcher(inputs: ProbTensors, outputs: dict[str, torch.Tensor], best: torch.Tensor, arrivals: torch.Tensor,
                   plan: FusedPlan, fast: bool, seed: int, offsets: torch.Tensor) -> Launch:
    """A zero-argument launch of the fused kernel into outputs (accepted_lengths, next_tokens,
    output_tokens, error_flags); offsets: philox_offsets (fast mode advances them every call).
    Arguments are bound once, and after the first call the compiled kernel is launched directly
    (BoundLaunch)."""
    batch, gamma, vocab = inputs.shape
    t = inputs
    grid = (batch, plan.splits)
    args = (
        t.draft_tokens, t.target_probs, t.draft_probs, t.uniforms, t.exponential_noise,
        outputs["accepted_lengths"], outputs["next_tokens"], outputs["output_tokens"], outputs["error_flags"],
        best, arrivals, offsets, seed, vocab, plan.splits,
        t.draft_tokens.stride(0), t.target_probs.stride(0), t.target_probs.stride(1),
        t.draft_probs.stride(0), t.draft_probs.stride(1), t.uniforms.stride(0), t.exponential_noise.stride(0),
        outputs["output_tokens"].stride(0),
    )
    meta = dict(
        GAMMA=gamma, GAMMA_PAD=triton.next_power_of_2(gamma), ROWS=plan.rows,
        LOGPROBS=t.logprobs, PRECISE_MATH=_precise_math(t.draft_tokens.device), FAST=fast,
    )
    launch_meta = dict(meta, num_warps=plan.num_warps)
    return BoundLaunch(_fused_kernel, grid, args, launch_meta, t.draft_tokens.device)


def launch_fused(inputs: ProbTensors, outputs: dict[str, torch.Tensor], best: torch.Tensor, arrivals: torch.Tensor,
                 plan: FusedPlan, fast: bool, seed: int = 0, offset: int = 0) -> None:
    """One launch of the fused kernel (see fused_launcher) from a fresh offset counter at offset."""
    offsets = philox_offsets(inputs.shape[0], offset, inputs.draft_tokens.device)
    fused_launcher(inputs, outputs, best, arrivals, plan, fast, seed, offsets)()


def _sweep_rows() -> int:
    """Rows of 4 columns per step of a one-program-per-row sweep (flashspec sample, serial)."""
    if INTERPRETED:
        return 128  # 512 columns a step: masking and several steps exercised at the tested sizes
    return SWEEP_ROWS


def flashspec_launcher(inputs: ProbTensors, outputs: dict[str, torch.Tensor], accepted: torch.Tensor,
                       fast: bool, seed: int, offsets: torch.Tensor) -> Launch:
    """verify -> gather -> sample into outputs (+ accept_probs, error_flags); accepted is int8 [B, γ]
    scratch; offsets: philox_offsets (fast mode: the sample kernel advances them every call)."""
    batch, gamma, vocab = inputs.shape
    t = inputs
    precise = _precise_math(t.draft_tokens.device)
    verify_args = (
        t.draft_tokens, t.target_probs, t.draft_probs, t.uniforms, accepted, outputs["accept_probs"], offsets,
        batch, seed, vocab,
        t.draft_tokens.stride(0), t.target_probs.stride(0), t.target_probs.stride(1),
        t.draft_probs.stride(0), t.draft_probs.stride(1), t.uniforms.stride(0),
    )
    verify_meta = dict(GAMMA=gamma, LOGPROBS=t.logprobs, PRECISE_MATH=precise, FAST=fast)
    gather_args = (t.draft_tokens, accepted, outputs["accepted_lengths"], outputs["output_tokens"], outputs["error_flags"],
                   batch * gamma, t.draft_tokens.stride(0), outputs["output_tokens"].stride(0))
    gather_meta = dict(GAMMA=gamma, GAMMA_PAD=triton.next_power_of_2(gamma))
    sample_args = (
        t.target_probs, t.draft_probs, t.exponential_noise, outputs["accepted_lengths"], outputs["next_tokens"],
        outputs["output_tokens"], offsets, seed, vocab,
        t.target_probs.stride(0), t.target_probs.stride(1), t.draft_probs.stride(0), t.draft_probs.stride(1),
        t.exponential_noise.stride(0), outputs["output_tokens"].stride(0),
    )
    sample_meta = dict(GAMMA=gamma, OUT_PAD=triton.next_power_of_2(gamma + 1), ROWS=_sweep_rows(),
                       LOGPROBS=t.logprobs, PRECISE_MATH=precise, FAST=fast, num_warps=SWEEP_WARPS)
    if INTERPRETED:
        verify = _flashspec_verify_kernel[(triton.cdiv(batch, INTERPRETER_BLOCK_B), gamma)]
        gather = _flashspec_gather_kernel[(triton.cdiv(batch * gamma, INTERPRETER_BLOCK_SIZE),)]
        verify_meta["BLOCK_B"] = INTERPRETER_BLOCK_B
        gather_meta["BLOCK_SIZE"] = INTERPRETER_BLOCK_SIZE
    else:
        verify = _flashspec_verify_tuned[lambda meta: (triton.cdiv(batch, meta["BLOCK_B"]), gamma)]
        gather = _flashspec_gather_tuned[lambda meta: (triton.cdiv(batch * gamma, meta["BLOCK_SIZE"]),)]
    sample = _flashspec_sample_kernel[(batch,)]

    def launch() -> None:
        verify(*verify_args, **verify_meta)
        gather(*gather_args, **gather_meta)
        sample(*sample_args, **sample_meta)

    return launch


def serial_launcher(inputs: ProbTensors, outputs: dict[str, torch.Tensor], recovered: torch.Tensor) -> Launch:
    """recovered tokens for all γ+1 positions, then the serial scan; recovered is int64 [B, γ+1] scratch.

    Always reads inputs.uniforms and inputs.exponential_noise (the vLLM design draws them with
    PyTorch before the kernels)."""
    batch, gamma, vocab = inputs.shape
    t = inputs
    precise = _precise_math(t.draft_tokens.device)
    recovered_args = (
        t.target_probs, t.draft_probs, t.exponential_noise, recovered, vocab,
        t.target_probs.stride(0), t.target_probs.stride(1), t.draft_probs.stride(0), t.draft_probs.stride(1),
        t.exponential_noise.stride(0),
    )
    recovered_meta = dict(GAMMA=gamma, ROWS=_sweep_rows(), LOGPROBS=t.logprobs, PRECISE_MATH=precise,
                          num_warps=SWEEP_WARPS)
    scan_args = (
        t.draft_tokens, t.target_probs, t.draft_probs, t.uniforms, recovered,
        outputs["accepted_lengths"], outputs["next_tokens"], outputs["output_tokens"], outputs["error_flags"], vocab,
        t.draft_tokens.stride(0), t.target_probs.stride(0), t.target_probs.stride(1),
        t.draft_probs.stride(0), t.draft_probs.stride(1), t.uniforms.stride(0), outputs["output_tokens"].stride(0),
    )
    scan_meta = dict(GAMMA=gamma, OUT_PAD=triton.next_power_of_2(gamma + 1), LOGPROBS=t.logprobs,
                     PRECISE_MATH=precise, num_warps=1)
    recover = _serial_recovered_kernel[(batch, gamma + 1)]
    scan = _serial_scan_kernel[(batch,)]

    def launch() -> None:
        recover(*recovered_args, **recovered_meta)
        scan(*scan_args, **scan_meta)

    return launch
