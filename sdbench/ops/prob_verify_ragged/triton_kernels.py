"""Triton kernels for prob_verify_ragged and their launchers (layout: sdbench/ops/prob_verify_ragged/__init__.py).

Two designs, both reproducing reference.prob_verify_ragged bit for bit on supplied randomness, built from
the padded prob_verify kernels' device helpers (sdbench.ops.prob_verify.triton_kernels: the race keys, the
noise, the accept uniforms, the three-tier degenerate-row rule, the atomic combine) and verify_ragged's
offset clamp (`_request_range`), so the arithmetic is the padded kernels' to the bit:

- fused (1 launch, sdbench's): `_fused_ragged_kernel`, grid (B, chunks), the padded `fused` design with
  each request's rows found from its offsets. Program (i, c) scans request i's γ_i drafts BLOCK positions
  per step (one step when BLOCK >= γ_i), reads chunk c of row k_i (p and q, or p alone at the bonus row),
  and folds its best race key into the request's slot; the last program to arrive writes the request's
  γ_i + 1 output slots. γ_i = 0 is the bonus race over the request's one target row.
- serial (2 launches, the peer): the design vLLM ships for its flattened layout (vllm/v1/sample/
  rejection_sampler.py, `sample_recovered_tokens_kernel` then `rejection_random_sample_kernel`), written
  here from that description: `_ragged_recovered_kernel` races every position of every request over the
  whole vocabulary (γ_i + 1 full sweeps per request, of which one is used; vLLM samples the bonus token in
  its main sampler, here it is the recovered token of position γ_i), then `_ragged_serial_scan_kernel`,
  one program per request, walks its drafts one scalar accept test at a time to the first rejection.

Randomness as in the padded kernels: supplied (uniforms [T], noise [B, V]) or, for fused, fast in-kernel
Philox keyed by (request, local position) for the accept tests and (request, column) for the race, so a
request drafts with the same numbers as the padded kernels' sequence of the same index. The offset lives
in a device counter per request (int64 [B]) that fused advances by one per call.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from sdbench.ops.prob_verify.triton_kernels import (
    SWEEP_WARPS,
    TOKEN_OUT_OF_RANGE,
    BoundLaunch,
    FusedPlan,
    Launch,
    _accept_uniforms,
    _arrive,
    _chunk_columns,
    _precise_math,
    _probs_at_tokens,
    _race_noise,
    _race_row,
    _race_winner,
    _release,
    _residual_keys,
    _sweep_rows,
)
from sdbench.ops.verify_ragged.triton_impls import _request_range

# Positions per scan step: next_pow2(γ_max) up to this. Above it the scan loops (correct for any γ_i); the
# public API, which cannot read γ_max without a sync, passes T and so scans 32 positions per step.
SCAN_BLOCK_MAX = 32
# serial: programs per request in the recovered launch, γ_max + 1 up to this (one position each, vLLM's
# grid); above it each program takes every P-th position, so a T-sized upper bound on γ_max stays linear.
RECOVERED_PROGRAMS_MAX = 128


# --- shared by both designs ---------------------------------------------------------------------
@triton.jit
def _write_request(draft_tokens_ptr, accepted_lengths_ptr, next_tokens_ptr, output_tokens_ptr, request, start,
                   length, k, next_token, BLOCK: tl.constexpr):
    """Request i's γ_i + 1 output slots at start + i (laid out like its target rows): its accepted drafts,
    the next token at slot k, -1 after; and its next token and k."""
    out_row = output_tokens_ptr + start + request
    out_type = output_tokens_ptr.dtype.element_ty
    for base in range(0, length + 1, BLOCK):
        positions = base + tl.arange(0, BLOCK)
        drafts = tl.load(draft_tokens_ptr + start + positions, mask=positions < k, other=0).to(tl.int64)
        slots = tl.where(positions < k, drafts, tl.where(positions == k, next_token, -1))
        tl.store(out_row + positions, slots.to(out_type), mask=positions <= length)
    tl.store(next_tokens_ptr + request, next_token.to(next_tokens_ptr.dtype.element_ty))
    tl.store(accepted_lengths_ptr + request, k.to(tl.int64))


# --- fused: one launch ----------------------------------------------------------------------------
@triton.jit
def _ragged_scan(draft_tokens_ptr, target_ptr, draft_ptr, uniforms_ptr, request, start, length, vocab, seed,
                 offset, stride_p_row, stride_q_row,
                 BLOCK: tl.constexpr, LOGPROBS: tl.constexpr, PRECISE_MATH: tl.constexpr, FAST: tl.constexpr):
    """(k, bad) of request i: its first rejected position (γ_i when none) and whether any of its drafts is
    outside [0, V) (read as p = q = 0: rejected, never loaded), BLOCK positions per step. Draft t's target
    row is t + i (the request's rows are shifted by one bonus row per earlier request)."""
    first = length
    bad = length * 0
    for base in range(0, length, BLOCK):
        positions = base + tl.arange(0, BLOCK)
        in_draft = positions < length
        tokens = tl.load(draft_tokens_ptr + start + positions, mask=in_draft, other=0).to(tl.int64)
        out_of_range = in_draft & ((tokens < 0) | (tokens >= vocab))
        readable = in_draft & ~out_of_range
        p = _probs_at_tokens(target_ptr + (start + request + positions) * stride_p_row, tokens, readable,
                             LOGPROBS, PRECISE_MATH)
        q = _probs_at_tokens(draft_ptr + (start + positions) * stride_q_row, tokens, readable, LOGPROBS, PRECISE_MATH)
        u = _accept_uniforms(uniforms_ptr + start, request, positions, in_draft, 0, seed, offset, FAST)
        rejected = in_draft & ~(u * q < p)
        first = tl.minimum(first, tl.min(tl.where(rejected, positions, length), axis=0))
        bad = tl.maximum(bad, tl.max(out_of_range.to(tl.int64), axis=0))
    return first, bad


@triton.jit(do_not_specialize=["seed"])
def _fused_ragged_kernel(
    draft_tokens_ptr, target_ptr, draft_ptr, uniforms_ptr, noise_ptr, cu_ptr,
    accepted_lengths_ptr, next_tokens_ptr, output_tokens_ptr, error_flags_ptr, best_ptr, arrivals_ptr, offsets_ptr,
    seed, vocab, chunks, total, stride_p_row, stride_q_row, stride_e_b,
    BLOCK: tl.constexpr, ROWS: tl.constexpr, LOGPROBS: tl.constexpr, PRECISE_MATH: tl.constexpr, FAST: tl.constexpr,
):
    """Grid (B, chunks). Program (i, c) owns columns [c·CHUNK, (c+1)·CHUNK), CHUNK = 4·ROWS, of request
    i's stopping row, as the padded `_fused_kernel` (same order: the chunk's noise is drawn while the scan's
    loads fly; same atomic combine into best[i] / arrivals[i], both int64 / int32 [B], zero at entry and
    left zero). The request's range [start, end) comes from cu, clamped to [0, T] (verify_ragged's
    `_request_range`): every row read is inside p [T + B, V] and q [T, V], every slot written inside
    output_tokens [T + B], whatever the offsets. The last arrival writes the outputs (re-reading the
    accepted drafts, L2-resident), error_flags[i], and in fast mode offset + 1. Registers: the padded
    kernel's plus the BLOCK-wide scan (BLOCK <= SCAN_BLOCK_MAX)."""
    request = tl.program_id(0).to(tl.int64)
    column = tl.program_id(1) * (4 * ROWS)
    cols = _chunk_columns(column, ROWS)
    if FAST:
        offset = tl.load(offsets_ptr + request)
    else:
        offset = 0
    start, end = _request_range(cu_ptr, request, total)
    length = end - start
    noise_row = noise_ptr + request * stride_e_b
    noise = _race_noise(noise_row, request, column, cols, vocab, seed, offset, ROWS, PRECISE_MATH, FAST)
    k, bad = _ragged_scan(draft_tokens_ptr, target_ptr, draft_ptr, uniforms_ptr, request, start, length, vocab,
                          seed, offset, stride_p_row, stride_q_row, BLOCK, LOGPROBS, PRECISE_MATH, FAST)

    has_draft = k < length
    target_row = target_ptr + (start + request + k) * stride_p_row
    draft_row = draft_ptr + (start + tl.maximum(tl.minimum(k, length - 1), 0)) * stride_q_row  # unread at the bonus row
    keys = _residual_keys(target_row, draft_row, noise, has_draft, cols, vocab, LOGPROBS, PRECISE_MATH, FAST)
    last = _arrive(keys, best_ptr, arrivals_ptr, request, chunks)
    if last:
        next_token = _race_winner(best_ptr, target_row, noise_row, request, vocab, seed, offset,
                                  ROWS, LOGPROBS, PRECISE_MATH, FAST)
        _write_request(draft_tokens_ptr, accepted_lengths_ptr, next_tokens_ptr, output_tokens_ptr, request, start,
                       length, k, next_token, BLOCK)
        tl.store(error_flags_ptr + request, bad.to(tl.int32) * TOKEN_OUT_OF_RANGE)
        _release(arrivals_ptr, offsets_ptr, request, offset, FAST)


# --- serial: vLLM's design, the peer --------------------------------------------------------------
@triton.jit
def _ragged_recovered_kernel(
    target_ptr, draft_ptr, noise_ptr, cu_ptr, recovered_ptr, vocab, total, programs,
    stride_p_row, stride_q_row, stride_e_b,
    ROWS: tl.constexpr, LOGPROBS: tl.constexpr, PRECISE_MATH: tl.constexpr,
):
    """Grid (B, P). Program (i, r) sweeps the whole vocabulary at request i's positions r, r + P, ... <= γ_i
    (one position each when P = γ_max + 1, as vLLM's grid (B, max_spec_len)): the residual race at a draft
    position, p alone at the bonus position γ_i; writes recovered[start + i + position] (int64, laid out
    like the target rows)."""
    request = tl.program_id(0).to(tl.int64)
    start, end = _request_range(cu_ptr, request, total)
    length = end - start
    noise_row = noise_ptr + request * stride_e_b
    for position in range(tl.program_id(1).to(tl.int64), length + 1, programs):
        target_row = target_ptr + (start + request + position) * stride_p_row
        draft_row = draft_ptr + (start + tl.maximum(tl.minimum(position, length - 1), 0)) * stride_q_row
        token = _race_row(target_row, draft_row, noise_row, position < length, request, vocab, 0, 0,
                          ROWS, LOGPROBS, PRECISE_MATH, False)
        tl.store(recovered_ptr + start + request + position, token)


@triton.jit
def _ragged_serial_scan_kernel(
    draft_tokens_ptr, target_ptr, draft_ptr, uniforms_ptr, cu_ptr, recovered_ptr,
    accepted_lengths_ptr, next_tokens_ptr, output_tokens_ptr, vocab, total, stride_p_row, stride_q_row,
    BLOCK: tl.constexpr, LOGPROBS: tl.constexpr, PRECISE_MATH: tl.constexpr,
):
    """Grid (B,). One program walks request i's drafts one scalar accept test at a time (k_i + 1 dependent
    load rounds) until the first rejection, takes the recovered token there (the bonus one at γ_i) and
    writes the request's outputs. A token outside [0, V) is read as p = q = 0 (rejected, never loaded);
    like vLLM's kernel it writes no error_flags."""
    request = tl.program_id(0).to(tl.int64)
    start, end = _request_range(cu_ptr, request, total)
    length = end - start
    position = start * 0
    rejected = 0
    while (position < length) & (rejected == 0):
        token = tl.load(draft_tokens_ptr + start + position).to(tl.int64)
        readable = (token >= 0) & (token < vocab)
        p = _probs_at_tokens(target_ptr + (start + request + position) * stride_p_row, token, readable,
                             LOGPROBS, PRECISE_MATH)
        q = _probs_at_tokens(draft_ptr + (start + position) * stride_q_row, token, readable, LOGPROBS, PRECISE_MATH)
        if tl.load(uniforms_ptr + start + position) * q < p:
            position += 1
        else:
            rejected = 1
    next_token = tl.load(recovered_ptr + start + request + position)
    _write_request(draft_tokens_ptr, accepted_lengths_ptr, next_tokens_ptr, output_tokens_ptr, request, start,
                   length, position, next_token, BLOCK)


# --- launchers ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class RaggedProbTensors:
    """The inputs of one prob_verify_ragged call as the kernels see them."""

    draft_tokens: torch.Tensor  # [T], contiguous
    target_probs: torch.Tensor  # [T + B, V], contiguous rows
    draft_probs: torch.Tensor  # [T, V], contiguous rows
    cu_num_draft_tokens: torch.Tensor  # [B] int64, contiguous
    uniforms: torch.Tensor  # [T] float32, contiguous (read in supplied mode only)
    exponential_noise: torch.Tensor  # [B, V] float32, contiguous rows (read in supplied mode only)
    logprobs: bool
    gamma_max: int  # an upper bound on every γ_i (sizes the scan step and the serial grid, never a result)

    def check(self) -> None:
        for name in ("draft_tokens", "cu_num_draft_tokens", "uniforms"):
            if not getattr(self, name).is_contiguous():
                raise ValueError(f"{name} must be contiguous (call .contiguous())")
        for name in ("target_probs", "draft_probs", "exponential_noise"):
            if getattr(self, name).stride(-1) != 1:
                raise ValueError(f"{name} needs a contiguous last dimension (call .contiguous())")

    @property
    def shape(self) -> tuple[int, int, int]:
        """(B, T, V)."""
        return self.cu_num_draft_tokens.shape[0], self.draft_tokens.shape[0], self.target_probs.shape[1]


def scan_block(gamma_max: int) -> int:
    return triton.next_power_of_2(max(1, min(gamma_max, SCAN_BLOCK_MAX)))


def fused_ragged_launcher(inputs: RaggedProbTensors, outputs: dict[str, torch.Tensor], best: torch.Tensor,
                          arrivals: torch.Tensor, plan: FusedPlan, fast: bool, seed: int,
                          offsets: torch.Tensor) -> Launch:
    """A zero-argument launch of the fused ragged kernel into outputs (accepted_lengths, next_tokens,
    output_tokens, error_flags); best / arrivals: zeroed int64 / int32 [B] scratch; offsets: the fast mode's
    counters (philox_offsets). Bound once, launched directly after the first call (BoundLaunch)."""
    batch, total, vocab = inputs.shape
    t = inputs
    args = (
        t.draft_tokens, t.target_probs, t.draft_probs, t.uniforms, t.exponential_noise, t.cu_num_draft_tokens,
        outputs["accepted_lengths"], outputs["next_tokens"], outputs["output_tokens"], outputs["error_flags"],
        best, arrivals, offsets, seed, vocab, plan.splits, total,
        t.target_probs.stride(0), t.draft_probs.stride(0), t.exponential_noise.stride(0),
    )
    meta = dict(BLOCK=scan_block(t.gamma_max), ROWS=plan.rows, LOGPROBS=t.logprobs,
                PRECISE_MATH=_precise_math(t.draft_tokens.device), FAST=fast, num_warps=plan.num_warps)
    return BoundLaunch(_fused_ragged_kernel, (batch, plan.splits), args, meta, t.draft_tokens.device)


def serial_ragged_launcher(inputs: RaggedProbTensors, outputs: dict[str, torch.Tensor],
                           recovered: torch.Tensor) -> Launch:
    """The recovered tokens of every position, then the serial scan; recovered: int64 [T + B] scratch.
    Always reads inputs.uniforms and inputs.exponential_noise (vLLM's design draws them with PyTorch first)."""
    batch, total, vocab = inputs.shape
    t = inputs
    precise = _precise_math(t.draft_tokens.device)
    programs = min(t.gamma_max + 1, RECOVERED_PROGRAMS_MAX)
    recovered_args = (t.target_probs, t.draft_probs, t.exponential_noise, t.cu_num_draft_tokens, recovered, vocab,
                      total, programs, t.target_probs.stride(0), t.draft_probs.stride(0), t.exponential_noise.stride(0))
    recovered_meta = dict(ROWS=_sweep_rows(), LOGPROBS=t.logprobs, PRECISE_MATH=precise, num_warps=SWEEP_WARPS)
    scan_args = (t.draft_tokens, t.target_probs, t.draft_probs, t.uniforms, t.cu_num_draft_tokens, recovered,
                 outputs["accepted_lengths"], outputs["next_tokens"], outputs["output_tokens"], vocab, total,
                 t.target_probs.stride(0), t.draft_probs.stride(0))
    scan_meta = dict(BLOCK=scan_block(t.gamma_max), LOGPROBS=t.logprobs, PRECISE_MATH=precise, num_warps=1)
    recover = _ragged_recovered_kernel[(batch, programs)]
    scan = _ragged_serial_scan_kernel[(batch,)]

    def launch() -> None:
        recover(*recovered_args, **recovered_meta)
        scan(*scan_args, **scan_meta)

    return launch
