"""Batched speculative decoding with one synchronized batch position, and the target-alone peer.

A round, for every sequence at once (layout and masking: sdbench.e2e.slots):
1. draft: γ forwards propose d_1..d_γ. The first forward processes two slots, [batch_position - 1,
   batch_position]: the target writes one more slot per round than the draft (d_γ), so when some
   sequence accepted all γ the draft cache lacks slot batch_position - 1. Re-running that slot costs
   one extra query row in a forward the draft makes anyway (no extra launch, no host sync, no
   data-dependent branch); where the slot was already cached it rewrites the same keys and values.
2. target: one forward over [pending, d_1..d_γ] gives γ + 1 target tokens (greedy) or distributions.
3. verification: any registered implementation (sdbench.e2e.verifier), optionally on sequences
   ordered by their acceptance EMA (a gather before, the inverse scatter after).
4. bookkeeping: slots past each sequence's k_i become gaps, the emitted tokens are appended, the
   batch position moves to (old position + max_i k_i + 1), where the next token is written.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from sdbench.e2e import slots
from sdbench.e2e.clock import PhaseClock
from sdbench.e2e.verifier import SdbenchError, Verifier


@dataclass
class Generation:
    """What one batched generation produced (host values, rich-free)."""

    tokens: list[list[int]]  # new tokens per sequence, cut at max_new_tokens and after the first EOS
    accepted_lengths: list[list[int]] = field(default_factory=list)  # per round: k_i of the active sequences
    rounds: int = 0  # batched target forwards after the prefill
    wall_s: float = 0.0
    phase_us: dict[str, list[float]] = field(default_factory=dict)  # per round (speculative only)
    timer: str = "perf_counter"

    @property
    def emitted_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)


def capacity_for(width: int, gamma: int, max_new_tokens: int) -> int:
    """Slots needed: each round emits >= 1 token per active sequence and advances at most γ + 1."""
    return width + (gamma + 1) * max_new_tokens + 1


def check_positions(model, width: int, gamma: int, max_new_tokens: int) -> None:
    limit = getattr(model.config, "max_position_embeddings", None)
    needed = width + max_new_tokens + gamma + 1
    if limit is not None and needed > limit:
        raise SdbenchError(f"prompt width {width} + max_new_tokens {max_new_tokens} + gamma {gamma} needs {needed} "
                           f"positions but the model has {limit}: shorten the prompts or lower --max-new-tokens")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Emitted:
    """Per-sequence output buffer on the device, filled without syncs."""

    def __init__(self, batch: int, gamma: int, max_new_tokens: int, eos_token_id: int | None,
                 device: torch.device) -> None:
        self.tokens = torch.full((batch, max_new_tokens + gamma + 2), -1, dtype=torch.int64, device=device)
        self.count = torch.zeros(batch, dtype=torch.int64, device=device)
        self.done = torch.zeros(batch, dtype=torch.bool, device=device)
        self.max_new_tokens = max_new_tokens
        self.eos_token_id = eos_token_id

    def append(self, round_tokens: torch.Tensor, lengths: torch.Tensor) -> None:
        """round_tokens [B, n]: the first lengths[i] of row i are new (nothing for finished rows)."""
        n = round_tokens.shape[1]
        offsets = torch.arange(n, device=round_tokens.device)[None, :]
        new = (offsets < lengths[:, None]) & ~self.done[:, None]
        junk = self.tokens.shape[1] - 1
        index = torch.where(new, self.count[:, None] + offsets, torch.full_like(offsets, junk))
        self.tokens.scatter_(1, index, torch.where(new, round_tokens, -1))
        if self.eos_token_id is not None:
            self.done |= (new & (round_tokens == self.eos_token_id)).any(dim=1)
        self.count += new.sum(dim=1)
        self.done |= self.count >= self.max_new_tokens

    def host_tokens(self) -> list[list[int]]:
        rows = []
        for row, count in zip(self.tokens.tolist(), self.count.tolist(), strict=True):
            row = row[: min(count, self.max_new_tokens)]
            if self.eos_token_id is not None and self.eos_token_id in row:
                row = row[: row.index(self.eos_token_id) + 1]
            rows.append(row)
        return rows


def speculative_generate(target, draft, prompts: list[list[int]], *, gamma: int, max_new_tokens: int,
                         verifier: Verifier, temperature: float = 0.0, generator: torch.Generator | None = None,
                         eos_token_id: int | None = None, pad_token_id: int = 0,
                         sort_by_acceptance: bool = False, acceptance_ema_decay: float = 0.9,
                         draft_gap_fix: bool = True) -> Generation:
    """Generate up to max_new_tokens per prompt with the draft proposing γ per round (see module doc)."""
    device = target.device
    batch = len(prompts)
    width = max(2, max(len(p) for p in prompts))
    check_positions(target, width, gamma, max_new_tokens)
    check_positions(draft, width, gamma, max_new_tokens)
    capacity = capacity_for(width, gamma, max_new_tokens)
    state, width = slots.left_pad(prompts, pad_token_id, capacity, device)
    target_cache = slots.new_static_cache(target, capacity)
    draft_cache = slots.new_static_cache(draft, capacity)
    emitted = _Emitted(batch, gamma, max_new_tokens, eos_token_id, device)
    acceptance_ema = torch.ones(batch, device=device)
    gamma_range = torch.arange(gamma + 1, device=device)
    clock = PhaseClock(device)
    traces: list[tuple[torch.Tensor, torch.Tensor]] = []
    sampling = temperature > 0

    _sync(device)
    started = time.perf_counter()
    with torch.inference_mode():
        slots.prefill(target, target_cache, state, width)
        slots.prefill(draft, draft_cache, state, width)
        rounds = 0
        while True:
            position = state.batch_position
            clock.mark()
            draft_tokens, draft_probs = _propose(draft, draft_cache, state, gamma, temperature, generator,
                                                 draft_gap_fix)
            clock.mark()
            slots.write_tokens(state, draft_tokens[:, -1:], position + gamma)
            target_inputs = torch.cat([state.pending[:, None], draft_tokens], dim=1)
            target_logits = slots.forward_slots(target, target_cache, state, target_inputs, position)
            target_scores = (target_logits / temperature).softmax(dim=-1) if sampling else target_logits.argmax(dim=-1)
            clock.mark()
            if sort_by_acceptance:
                order = torch.argsort(acceptance_ema, descending=True, stable=True)
                sorted_probs = draft_probs[order] if sampling else None
                k_sorted, next_sorted = verifier(draft_tokens[order], target_scores[order], sorted_probs, generator)
                accepted = torch.empty_like(k_sorted).scatter_(0, order, k_sorted)
                next_tokens = torch.empty_like(next_sorted).scatter_(0, order, next_sorted)
            else:
                accepted, next_tokens = verifier(draft_tokens, target_scores, draft_probs, generator)
            clock.mark()
            active = ~emitted.done
            traces.append((accepted.clone(), active))
            state.valid.index_copy_(1, position + gamma_range, gamma_range[None, :] <= accepted[:, None])
            round_tokens = torch.cat([draft_tokens, draft_tokens.new_zeros((batch, 1))], dim=1)
            round_tokens.scatter_(1, accepted[:, None], next_tokens[:, None])
            emitted.append(round_tokens, accepted + 1)
            acceptance_ema.mul_(acceptance_ema_decay).add_(accepted.float() / gamma, alpha=1 - acceptance_ema_decay)
            state.batch_position = position + accepted.max() + 1
            state.pending = next_tokens
            clock.mark()
            rounds += 1
            if bool(emitted.done.all()):  # the one sync per round, outside the timed phases
                break
    _sync(device)
    wall_s = time.perf_counter() - started
    return Generation(tokens=emitted.host_tokens(), accepted_lengths=_host_trace(traces), rounds=rounds,
                      wall_s=wall_s, phase_us=clock.phase_us(), timer=clock.method)


def _propose(draft, cache, state: slots.SlotState, gamma: int, temperature: float,
             generator: torch.Generator | None, gap_fix: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """γ draft tokens [B, γ] and, when sampling, their distributions q [B, γ, V]."""
    position = state.batch_position
    batch = state.pending.shape[0]
    slots.write_tokens(state, state.pending[:, None], position)
    if gap_fix:
        start = position - 1
        inputs = state.tokens.index_select(1, start + torch.arange(2, device=position.device))
    else:
        start, inputs = position, state.pending[:, None]
    draft_tokens = torch.empty((batch, gamma), dtype=torch.int64, device=position.device)
    draft_probs = None
    for j in range(gamma):
        if j > 0:
            start = position + j
            inputs = draft_tokens[:, j - 1: j]
            slots.write_tokens(state, inputs, start)
        logits = slots.forward_slots(draft, cache, state, inputs, start)[:, -1]
        if temperature > 0:
            q = (logits / temperature).softmax(dim=-1)
            if draft_probs is None:
                draft_probs = torch.empty((batch, gamma, q.shape[-1]), device=q.device)
            draft_probs[:, j] = q
            draft_tokens[:, j] = slots.sample_race(q, generator)
        else:
            draft_tokens[:, j] = logits.argmax(dim=-1)
    return draft_tokens, draft_probs


def _host_trace(traces: list[tuple[torch.Tensor, torch.Tensor]]) -> list[list[int]]:
    rows = []
    for accepted, active in traces:
        rows.append([k for k, a in zip(accepted.tolist(), active.tolist(), strict=True) if a])
    return rows


def target_generate(target, prompts: list[list[int]], *, max_new_tokens: int, temperature: float = 0.0,
                    generator: torch.Generator | None = None, eos_token_id: int | None = None,
                    pad_token_id: int = 0) -> Generation:
    """The target alone, one token per forward, same batch, layout and masking as the speculative loop."""
    device = target.device
    batch = len(prompts)
    width = max(2, max(len(p) for p in prompts))
    check_positions(target, width, 0, max_new_tokens)
    capacity = width + max_new_tokens + 1
    state, width = slots.left_pad(prompts, pad_token_id, capacity, device)
    cache = slots.new_static_cache(target, capacity)
    emitted = _Emitted(batch, 0, max_new_tokens, eos_token_id, device)
    ones = torch.ones(batch, dtype=torch.int64, device=device)
    _sync(device)
    started = time.perf_counter()
    with torch.inference_mode():
        slots.prefill(target, cache, state, width)
        rounds = 0
        while True:
            position = state.batch_position
            slots.write_tokens(state, state.pending[:, None], position)
            logits = slots.forward_slots(target, cache, state, state.pending[:, None], position)[:, -1]
            next_tokens = slots.next_from_logits(logits, temperature, generator)
            emitted.append(next_tokens[:, None], ones)
            state.batch_position = position + 1
            state.pending = next_tokens
            rounds += 1
            if bool(emitted.done.all()):
                break
    _sync(device)
    return Generation(tokens=emitted.host_tokens(), rounds=rounds, wall_s=time.perf_counter() - started)
