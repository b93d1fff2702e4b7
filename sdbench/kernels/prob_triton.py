"""Triton kernels for prob_verify (Leviathan rejection sampling) and their launchers.

Three designs, all reproducing `sdbench.reference.prob_verify` bit for bit on supplied randomness:

- flashspec (seed design, 3 launches): `_flashspec_verify_kernel` tests every (sequence, position)
  reading only the token id and the two scalars p, q; `_flashspec_gather_kernel` writes the accepted
  drafts and -1 at positions >= the first rejection; `_flashspec_sample_kernel` (one program per
  sequence) sweeps V once at the row where the sequence stopped and writes the next token.
- serial_sampler (the vLLM V1 random-path design, 2 launches): `_serial_recovered_kernel` draws a
  recovered token for EVERY position (γ+1 full-vocabulary sweeps per sequence), then
  `_serial_scan_kernel` (one program per sequence) scans the positions serially.
- fused (1 launch): `_fused_kernel`, grid (B, splits). Every program recomputes its sequence's
  γ-step acceptance scan (γ scalar pairs, L2-resident), sweeps its share of the vocabulary at the
  stopping row only, and folds its best race key into a per-sequence 64-bit slot with atomic_max;
  the last program to arrive writes the outputs and resets the slot and the arrival counter.

The exponential race. The next token is argmax_j w_j / E_j over w = max(0, p - q) (q := 0 at the
bonus row), E iid Exp(1): one pass, no normalising sum. Keys pack into one int64 so a single
atomic_max combines value and index: bit 62 = (w_j > 0) (residual candidates beat the fallback
race over p, used only when w is 0 everywhere), bits 31..61 = the float bits of the key (a
non-negative float orders like its bits), bits 0..30 = 2^31-1-j (ties go to the smallest index,
like torch.argmax). Masked lanes are -1; every real key is >= 1 (V < 2^31 - 1).

Randomness. Supplied (FAST=False): uniforms [B, γ] and exponential noise [B, V] are read, and the
race divides with div_rn (IEEE, like PyTorch) so tokens match the reference exactly; log-probs are
decoded with libdevice's expf on CUDA (PyTorch's expf) and tl.exp under the interpreter. Fast
(FAST=True): Philox4x32-10 keyed by seed, with counter (index, sequence, offset, stream): stream 0
gives the accept uniform of (sequence, position), stream 1 the race noise of (sequence, column),
E = -log1p(-u) (libdevice on CUDA). One Philox call yields 4 uniforms, used for the 4 quarters of a BLOCK_V tile, so the
stream is a function of BLOCK_V (fixed here): the same seed and offset give the same tokens from
fused and flashspec, on any grid.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

try:
    from triton.language.extra import libdevice
except ImportError:  # older Triton layouts
    from triton.language.extra.cuda import libdevice

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # triton.jit reads it at decoration time

VOCAB_TILE = 2048  # vocabulary tile: 4 quarters of 512 (4 floats per thread at 4 warps: 16-byte loads)
# Globals a jit function reads must be constexpr.
BLOCK_V = tl.constexpr(VOCAB_TILE)
QUARTER = tl.constexpr(VOCAB_TILE // 4)
INDEX_BITS_MASK = tl.constexpr(2**31 - 1)
STREAM_ACCEPT = tl.constexpr(0)
STREAM_RACE = tl.constexpr(1)
FUSED_WARPS = 4
FUSED_PROGRAMS_PER_SM = 4  # enough resident programs per SM to keep ~16 KB of loads each in flight


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
def _exponential(uniform, PRECISE_MATH: tl.constexpr):
    """E = -log(1 - u) ~ Exp(1), accurate to a few ulp over the whole range.

    The race is decided by the smallest E/w, so small E must keep its relative accuracy: u has
    fine resolution near 0 (k·2^-31), which -log1p(-u) preserves, whereas -log(u) would take small E
    from u near 1, where float32 steps are 2^-24 and an approximate log is off by ~1e-7 absolute.
    Clamped to FLT_MIN so that u = 0 (probability 2^-31) gives a huge finite key, never 0/0."""
    if PRECISE_MATH:
        exponential = -libdevice.log1p(-uniform)
    else:
        complement = 1.0 - uniform  # log1p from log (Goldberg): u / (1 - complement) corrects the rounding
        rounded = tl.where(complement == 1.0, 1.0, 1.0 - complement)
        exponential = tl.where(complement == 1.0, uniform, -tl.log(complement) * uniform / rounded)
    return tl.maximum(exponential, 1.1754943508222875e-38)


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
def _quarter_keys(target_row, draft_row, noise_row, has_draft, cols, vocab, uniform,
                  LOGPROBS: tl.constexpr, PRECISE_MATH: tl.constexpr, FAST: tl.constexpr):
    """Packed race keys of one quarter tile (see the module docstring); -1 on masked lanes."""
    valid = cols < vocab
    target = _decode(tl.load(target_row + cols, mask=valid, other=0.0), LOGPROBS, PRECISE_MATH)
    # cols < (V or 0), not valid & has_draft: the interpreter mistypes a vector & scalar-bool mask
    draft_limit = tl.where(has_draft, vocab, 0)
    draft = _decode(tl.load(draft_row + cols, mask=cols < draft_limit, other=0.0), LOGPROBS, PRECISE_MATH)
    draft = tl.where(has_draft, draft, 0.0)
    residual = tl.maximum(target - draft, 0.0)
    positive = residual > 0
    source = tl.where(positive, residual, target)
    if FAST:
        key = source / _exponential(uniform, PRECISE_MATH)  # approximate division: ~2 ulp, no reference to match
    else:
        noise = tl.load(noise_row + cols, mask=valid, other=1.0)
        key = tl.math.div_rn(source, noise)  # IEEE division: the same bits as PyTorch's w / E
    key_bits = key.to(tl.int32, bitcast=True) & 0x7FFFFFFF  # drops the sign of a -0.0
    packed = (positive.to(tl.int64) << 62) | (key_bits.to(tl.int64) << 31) | (cols ^ INDEX_BITS_MASK).to(tl.int64)
    return tl.where(valid, packed, -1)


@triton.jit
def _tile_keys(target_row, draft_row, noise_row, has_draft, b, tile, vocab, seed, offset,
               LOGPROBS: tl.constexpr, PRECISE_MATH: tl.constexpr, FAST: tl.constexpr):
    """Elementwise max of the packed keys of the 4 quarters of vocabulary tile `tile` ([QUARTER])."""
    lane = tl.arange(0, QUARTER)
    if FAST:
        u0, u1, u2, u3 = _philox_uniforms(seed, offset, b, lane + tile * QUARTER, STREAM_RACE)
    else:
        u0 = tl.zeros([QUARTER], tl.float32)
        u1 = u0
        u2 = u0
        u3 = u0
    base = lane + tile * BLOCK_V  # tensor first: the interpreter keeps `constexpr op tensor` a constexpr
    keys = _quarter_keys(target_row, draft_row, noise_row, has_draft, base, vocab, u0, LOGPROBS, PRECISE_MATH, FAST)
    keys = tl.maximum(keys, _quarter_keys(target_row, draft_row, noise_row, has_draft, base + QUARTER, vocab, u1,
                                          LOGPROBS, PRECISE_MATH, FAST))
    keys = tl.maximum(keys, _quarter_keys(target_row, draft_row, noise_row, has_draft, base + 2 * QUARTER, vocab, u2,
                                          LOGPROBS, PRECISE_MATH, FAST))
    keys = tl.maximum(keys, _quarter_keys(target_row, draft_row, noise_row, has_draft, base + 3 * QUARTER, vocab, u3,
                                          LOGPROBS, PRECISE_MATH, FAST))
    return keys


@triton.jit
def _token_of(packed):
    return (packed & INDEX_BITS_MASK) ^ INDEX_BITS_MASK  # = 2^31-1 - index bits


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


# --- fused: one launch, split vocabulary sweep, atomic combine -----------------------------------
@triton.jit(do_not_specialize=["seed", "offset"])
def _fused_kernel(
    draft_tokens_ptr, target_ptr, draft_ptr, uniforms_ptr, noise_ptr,
    accepted_lengths_ptr, next_tokens_ptr, output_tokens_ptr, best_ptr, arrivals_ptr,
    seed, offset, vocab, tiles_per_split, splits,
    stride_tok_b, stride_p_b, stride_p_row, stride_q_b, stride_q_row, stride_u_b, stride_e_b, stride_out_b,
    GAMMA: tl.constexpr, GAMMA_PAD: tl.constexpr, OUT_PAD: tl.constexpr,
    LOGPROBS: tl.constexpr, PRECISE_MATH: tl.constexpr, FAST: tl.constexpr,
):
    """Grid (B, splits). Program (b, s): the acceptance scan of sequence b (γ token ids, γ p and q
    scalars, γ uniforms), then tiles [s·tiles_per_split, (s+1)·tiles_per_split) of the stopping row
    (p and q there, or p alone at the bonus row), one atomic_max and one atomic_add. The last
    arrival decodes the winner and writes the outputs. Registers: a [QUARTER] int64 running max plus
    one quarter's p, q, noise at a time (4 elements each per thread at 4 warps); no shared memory
    beyond the reductions. best_ptr (int64 [B]) and arrivals_ptr (int32 [B]) must start zeroed;
    each launch leaves them zeroed, so CUDA-graph replays start clean.
    """
    b = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)

    positions = tl.arange(0, GAMMA_PAD)
    in_draft = positions < GAMMA
    tokens = tl.load(draft_tokens_ptr + b * stride_tok_b + positions, mask=in_draft, other=0).to(tl.int64)
    p = _decode(tl.load(target_ptr + b * stride_p_b + positions * stride_p_row + tokens, mask=in_draft, other=0.0),
                LOGPROBS, PRECISE_MATH)
    q = _decode(tl.load(draft_ptr + b * stride_q_b + positions * stride_q_row + tokens, mask=in_draft, other=0.0),
                LOGPROBS, PRECISE_MATH)
    u = _accept_uniforms(uniforms_ptr, b, positions, in_draft, stride_u_b, seed, offset, FAST)
    rejected = in_draft & ~(u * q < p)
    k = tl.min(tl.where(rejected, positions, GAMMA), axis=0)

    has_draft = k < GAMMA
    target_row = target_ptr + b * stride_p_b + k * stride_p_row
    draft_row = draft_ptr + b * stride_q_b + tl.minimum(k, GAMMA - 1) * stride_q_row
    noise_row = noise_ptr + b * stride_e_b
    first_tile = split * tiles_per_split
    last_tile = tl.minimum(first_tile + tiles_per_split, tl.cdiv(vocab, BLOCK_V))
    best = tl.full([QUARTER], -1, tl.int64)
    for tile in range(first_tile, last_tile):
        best = tl.maximum(best, _tile_keys(target_row, draft_row, noise_row, has_draft, b, tile, vocab, seed, offset,
                                           LOGPROBS, PRECISE_MATH, FAST))
    tl.atomic_max(best_ptr + b, tl.max(best, axis=0))
    arrived = tl.atomic_add(arrivals_ptr + b, 1)  # acq_rel: orders this program's atomic_max before it
    if arrived == splits - 1:
        winner = tl.atomic_xchg(best_ptr + b, 0)  # read the combined key and reset the slot at once
        _write_outputs(draft_tokens_ptr, accepted_lengths_ptr, next_tokens_ptr, output_tokens_ptr, b, k,
                       _token_of(winner), stride_tok_b, stride_out_b, GAMMA, OUT_PAD)
        tl.atomic_xchg(arrivals_ptr + b, 0)


# --- flashspec: verify (scalars only) + gather + sample ------------------------------------------
@triton.jit(do_not_specialize=["seed", "offset"])
def _flashspec_verify_kernel(
    draft_tokens_ptr, target_ptr, draft_ptr, uniforms_ptr, accepted_ptr, accept_probs_ptr,
    batch, seed, offset,
    stride_tok_b, stride_p_b, stride_p_row, stride_q_b, stride_q_row, stride_u_b,
    GAMMA: tl.constexpr, LOGPROBS: tl.constexpr, PRECISE_MATH: tl.constexpr, FAST: tl.constexpr,
    BLOCK_B: tl.constexpr,
):
    """Grid (⌈B/BLOCK_B⌉, γ). Program (j, i): sequences [j·BLOCK_B, (j+1)·BLOCK_B) at position i
    read their token id, p and q at it and the uniform, and write the accept flag (int8 [B, γ]) and
    accept_probs = min(1, p/q) (float32 [B, γ]). Never touches the vocabulary beyond one element."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_B + tl.arange(0, BLOCK_B)
    position = tl.program_id(1)
    valid = rows < batch
    tokens = tl.load(draft_tokens_ptr + rows * stride_tok_b + position, mask=valid, other=0).to(tl.int64)
    p = _decode(tl.load(target_ptr + rows * stride_p_b + position * stride_p_row + tokens, mask=valid, other=0.0),
                LOGPROBS, PRECISE_MATH)
    q = _decode(tl.load(draft_ptr + rows * stride_q_b + position * stride_q_row + tokens, mask=valid, other=0.0),
                LOGPROBS, PRECISE_MATH)
    u = _accept_uniforms(uniforms_ptr, rows, position, valid, stride_u_b, seed, offset, FAST)
    accepted = u * q < p
    safe_q = tl.where(q > 0, q, 1.0)
    ratio = tl.minimum(tl.math.div_rn(p, safe_q), 1.0)
    accept_prob = tl.where(q > 0, ratio, tl.where(p > 0, 1.0, 0.0))
    tl.store(accepted_ptr + rows * GAMMA + position, accepted.to(tl.int8), mask=valid)
    tl.store(accept_probs_ptr + rows * GAMMA + position, accept_prob, mask=valid)


@triton.jit
def _flashspec_gather_kernel(
    draft_tokens_ptr, accepted_ptr, accepted_lengths_ptr, output_tokens_ptr,
    total, stride_tok_b, stride_out_b,
    GAMMA: tl.constexpr, GAMMA_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):
    """Grid ⌈B·γ/BLOCK_SIZE⌉ over the flattened (sequence, position) pairs: each lane finds its
    sequence's first rejection k from the γ accept flags ([BLOCK_SIZE, GAMMA_PAD] int8 tile) and
    writes the draft token at positions < k, -1 at positions >= k (the sample kernel then writes the
    next token at k and column γ); position-0 lanes write accepted_lengths."""
    flat = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    valid = flat < total
    rows = flat // GAMMA
    position = flat % GAMMA
    positions = tl.arange(0, GAMMA_PAD)
    in_draft = valid[:, None] & (positions[None, :] < GAMMA)
    flags = tl.load(accepted_ptr + rows[:, None] * GAMMA + positions[None, :], mask=in_draft, other=1)
    k = tl.min(tl.where(in_draft & (flags == 0), positions[None, :], GAMMA), axis=1)
    drafts = tl.load(draft_tokens_ptr + rows * stride_tok_b + position, mask=valid, other=0)
    out = tl.where(position < k, drafts, -1)
    tl.store(output_tokens_ptr + rows * stride_out_b + position, out.to(output_tokens_ptr.dtype.element_ty), mask=valid)
    tl.store(accepted_lengths_ptr + rows, k.to(tl.int64), mask=valid & (position == 0))


@triton.jit(do_not_specialize=["seed", "offset"])
def _flashspec_sample_kernel(
    target_ptr, draft_ptr, noise_ptr, accepted_lengths_ptr, next_tokens_ptr, output_tokens_ptr,
    seed, offset, vocab,
    stride_p_b, stride_p_row, stride_q_b, stride_q_row, stride_e_b, stride_out_b,
    GAMMA: tl.constexpr, OUT_PAD: tl.constexpr,
    LOGPROBS: tl.constexpr, PRECISE_MATH: tl.constexpr, FAST: tl.constexpr,
):
    """Grid (B,). One program sweeps all of row k = accepted_lengths[b] (one pass, running max of the
    packed race keys) and writes next_tokens[b], output_tokens[b, k] and output_tokens[b, γ]."""
    b = tl.program_id(0).to(tl.int64)
    k = tl.load(accepted_lengths_ptr + b).to(tl.int32)
    has_draft = k < GAMMA
    target_row = target_ptr + b * stride_p_b + k * stride_p_row
    draft_row = draft_ptr + b * stride_q_b + tl.minimum(k, GAMMA - 1) * stride_q_row
    noise_row = noise_ptr + b * stride_e_b
    best = tl.full([QUARTER], -1, tl.int64)
    for tile in range(0, tl.cdiv(vocab, BLOCK_V)):
        best = tl.maximum(best, _tile_keys(target_row, draft_row, noise_row, has_draft, b, tile, vocab, seed, offset,
                                           LOGPROBS, PRECISE_MATH, FAST))
    next_token = _token_of(tl.max(best, axis=0))
    tl.store(next_tokens_ptr + b, next_token.to(next_tokens_ptr.dtype.element_ty))
    cols = tl.arange(0, OUT_PAD)
    tail = tl.where(cols == k, next_token, -1)
    tl.store(output_tokens_ptr + b * stride_out_b + cols, tail.to(output_tokens_ptr.dtype.element_ty),
             mask=(cols == k) | (cols == GAMMA))


# --- serial_sampler: recovered token for every position, then a serial scan ----------------------
@triton.jit
def _serial_recovered_kernel(
    target_ptr, draft_ptr, noise_ptr, recovered_ptr, vocab,
    stride_p_b, stride_p_row, stride_q_b, stride_q_row, stride_e_b,
    GAMMA: tl.constexpr, LOGPROBS: tl.constexpr, PRECISE_MATH: tl.constexpr,
):
    """Grid (B, γ+1). Program (b, i) sweeps the whole vocabulary at row i (residual p_i - q_i, or p_γ
    at i = γ) with the sequence's noise row and writes recovered[b, i]: γ+1 full sweeps per
    sequence, of which the scan uses one."""
    b = tl.program_id(0).to(tl.int64)
    position = tl.program_id(1)
    has_draft = position < GAMMA
    target_row = target_ptr + b * stride_p_b + position * stride_p_row
    draft_row = draft_ptr + b * stride_q_b + tl.minimum(position, GAMMA - 1) * stride_q_row
    noise_row = noise_ptr + b * stride_e_b
    best = tl.full([QUARTER], -1, tl.int64)
    for tile in range(0, tl.cdiv(vocab, BLOCK_V)):
        best = tl.maximum(best, _tile_keys(target_row, draft_row, noise_row, has_draft, b, tile, vocab, 0, 0,
                                           LOGPROBS, PRECISE_MATH, False))
    tl.store(recovered_ptr + b * (GAMMA + 1) + position, _token_of(tl.max(best, axis=0)))


@triton.jit
def _serial_scan_kernel(
    draft_tokens_ptr, target_ptr, draft_ptr, uniforms_ptr, recovered_ptr,
    accepted_lengths_ptr, next_tokens_ptr, output_tokens_ptr,
    stride_tok_b, stride_p_b, stride_p_row, stride_q_b, stride_q_row, stride_u_b, stride_out_b,
    GAMMA: tl.constexpr, OUT_PAD: tl.constexpr, LOGPROBS: tl.constexpr, PRECISE_MATH: tl.constexpr,
):
    """Grid (B,). One program walks positions 0..γ-1 one scalar at a time until the first rejection,
    then takes the recovered token there (or the bonus at γ) and writes the outputs."""
    b = tl.program_id(0).to(tl.int64)
    k = tl.program_id(0) * 0 + GAMMA  # a runtime int32 scalar, carried through the loop
    for position in range(0, GAMMA):
        if k == GAMMA:
            token = tl.load(draft_tokens_ptr + b * stride_tok_b + position).to(tl.int64)
            p = _decode(tl.load(target_ptr + b * stride_p_b + position * stride_p_row + token), LOGPROBS, PRECISE_MATH)
            q = _decode(tl.load(draft_ptr + b * stride_q_b + position * stride_q_row + token), LOGPROBS, PRECISE_MATH)
            u = tl.load(uniforms_ptr + b * stride_u_b + position)
            k = tl.where(u * q < p, k, position)
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
    """How the fused kernel splits each sequence's vocabulary sweep."""

    splits: int  # programs per sequence
    tiles_per_split: int  # BLOCK_V tiles each program sweeps


def fused_plan(batch: int, vocab: int, target_programs: int) -> FusedPlan:
    """Split so B·splits ≈ target_programs (but at least one BLOCK_V tile per program)."""
    tiles = triton.cdiv(vocab, VOCAB_TILE)
    splits = max(1, min(tiles, triton.cdiv(target_programs, batch)))
    tiles_per_split = triton.cdiv(tiles, splits)
    return FusedPlan(splits=triton.cdiv(tiles, tiles_per_split), tiles_per_split=tiles_per_split)


def default_fused_plan(batch: int, vocab: int, device: torch.device) -> FusedPlan:
    if device.type == "cuda":
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        return fused_plan(batch, vocab, FUSED_PROGRAMS_PER_SM * sms)
    return fused_plan(batch, vocab, 4 * batch)  # the interpreter: a few splits, to exercise the combine


def _precise_math(device: torch.device) -> bool:
    return device.type == "cuda" and not INTERPRETED


def _philox_offset(offset: int) -> int:
    return offset % 2**31  # one 32-bit counter word; kept below 2^31 so it stays an int32 argument


Launch = Callable[[], None]


def fused_launcher(inputs: ProbTensors, outputs: dict[str, torch.Tensor], best: torch.Tensor, arrivals: torch.Tensor,
                   plan: FusedPlan, fast: bool, seed: int = 0, offset: int = 0) -> Launch:
    """A zero-argument launch of the fused kernel into outputs (accepted_lengths, next_tokens,
    output_tokens); arguments are bound once, so a call costs only Triton's launch."""
    batch, gamma, vocab = inputs.shape
    t = inputs
    grid = (batch, plan.splits)
    args = (
        t.draft_tokens, t.target_probs, t.draft_probs, t.uniforms, t.exponential_noise,
        outputs["accepted_lengths"], outputs["next_tokens"], outputs["output_tokens"], best, arrivals,
        seed, _philox_offset(offset), vocab, plan.tiles_per_split, plan.splits,
        t.draft_tokens.stride(0), t.target_probs.stride(0), t.target_probs.stride(1),
        t.draft_probs.stride(0), t.draft_probs.stride(1), t.uniforms.stride(0), t.exponential_noise.stride(0),
        outputs["output_tokens"].stride(0),
    )
    meta = dict(
        GAMMA=gamma, GAMMA_PAD=triton.next_power_of_2(gamma), OUT_PAD=triton.next_power_of_2(gamma + 1),
        LOGPROBS=t.logprobs, PRECISE_MATH=_precise_math(t.draft_tokens.device), FAST=fast, num_warps=FUSED_WARPS,
    )
    kernel = _fused_kernel[grid]
    return lambda: kernel(*args, **meta)


def launch_fused(inputs: ProbTensors, outputs: dict[str, torch.Tensor], best: torch.Tensor, arrivals: torch.Tensor,
                 plan: FusedPlan, fast: bool, seed: int = 0, offset: int = 0) -> None:
    """One launch of the fused kernel (see fused_launcher)."""
    fused_launcher(inputs, outputs, best, arrivals, plan, fast, seed, offset)()


def flashspec_launcher(inputs: ProbTensors, outputs: dict[str, torch.Tensor], accepted: torch.Tensor,
                       fast: bool, seed: int = 0, offset: int = 0) -> Launch:
    """verify -> gather -> sample into outputs (+ accept_probs); accepted is int8 [B, γ] scratch."""
    batch, gamma, vocab = inputs.shape
    t = inputs
    precise = _precise_math(t.draft_tokens.device)
    verify_args = (
        t.draft_tokens, t.target_probs, t.draft_probs, t.uniforms, accepted, outputs["accept_probs"],
        batch, seed, _philox_offset(offset),
        t.draft_tokens.stride(0), t.target_probs.stride(0), t.target_probs.stride(1),
        t.draft_probs.stride(0), t.draft_probs.stride(1), t.uniforms.stride(0),
    )
    verify_meta = dict(GAMMA=gamma, LOGPROBS=t.logprobs, PRECISE_MATH=precise, FAST=fast)
    gather_args = (t.draft_tokens, accepted, outputs["accepted_lengths"], outputs["output_tokens"],
                   batch * gamma, t.draft_tokens.stride(0), outputs["output_tokens"].stride(0))
    gather_meta = dict(GAMMA=gamma, GAMMA_PAD=triton.next_power_of_2(gamma))
    sample_args = (
        t.target_probs, t.draft_probs, t.exponential_noise, outputs["accepted_lengths"], outputs["next_tokens"],
        outputs["output_tokens"], seed, _philox_offset(offset), vocab,
        t.target_probs.stride(0), t.target_probs.stride(1), t.draft_probs.stride(0), t.draft_probs.stride(1),
        t.exponential_noise.stride(0), outputs["output_tokens"].stride(0),
    )
    sample_meta = dict(GAMMA=gamma, OUT_PAD=triton.next_power_of_2(gamma + 1), LOGPROBS=t.logprobs,
                       PRECISE_MATH=precise, FAST=fast, num_warps=FUSED_WARPS)
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
    recovered_meta = dict(GAMMA=gamma, LOGPROBS=t.logprobs, PRECISE_MATH=precise, num_warps=FUSED_WARPS)
    scan_args = (
        t.draft_tokens, t.target_probs, t.draft_probs, t.uniforms, recovered,
        outputs["accepted_lengths"], outputs["next_tokens"], outputs["output_tokens"],
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
