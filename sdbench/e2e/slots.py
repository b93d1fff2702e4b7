"""The synchronized-batch ("v2") cache layout shared by the speculative loop and the target-alone peer.

Every sequence of the batch writes to the same cache slot at the same time: one `batch_position` (a 0-d
device tensor, so advancing it never syncs) for the whole batch, a `StaticCache` per model, and a
boolean `valid [B, L]` saying which slots hold content. Rejected drafts become gaps (valid = False);
a token's position id is the number of valid slots before it (the mask's cumulative sum), so content
positions stay contiguous whatever the gaps.

Each forward gets a 4-D additive mask [B, 1, n, L] built here, which transformers returns as-is: query
at slot s sees valid slots <= s, and always itself (a query whose row were all masked would make NaN
keys and values in later layers, and NaN · 0 poisons every reader of that slot).

Writing at a chosen slot: transformers 5's StaticLayer writes at its `cumulative_length` tensor and
advances it, so `seek` copies the batch position into it (a device-to-device copy, no sync).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import StaticCache

from sdbench.e2e.verifier import SdbenchError


@dataclass
class SlotState:
    """Token ids and validity of every cache slot, plus where the next write goes."""

    tokens: torch.Tensor  # [B, L] int64, the token written at each slot
    valid: torch.Tensor  # [B, L] bool, the slot holds content (False: padding or a rejected draft)
    batch_position: torch.Tensor  # 0-d int64 on the device: the slot of the pending token
    pending: torch.Tensor  # [B] int64, the last emitted token, not yet in any cache

    @property
    def capacity(self) -> int:
        return self.tokens.shape[1]


def new_static_cache(model, capacity: int) -> StaticCache:
    cache = StaticCache(config=model.config, max_cache_len=capacity)
    if not all(hasattr(layer, "cumulative_length") for layer in cache.layers):
        raise SdbenchError("this transformers version's StaticCache has no per-layer cumulative_length to seek; "
                           "install transformers>=5 (pip install 'transformers>=5')")
    return cache


def seek(cache: StaticCache, slot: torch.Tensor) -> None:
    """The next update of every layer writes at `slot` (0-d device tensor)."""
    for layer in cache.layers:
        if layer.is_initialized:
            layer.cumulative_length.copy_(slot)


def left_pad(prompts: list[list[int]], pad_token: int, capacity: int, device: torch.device) -> tuple[SlotState, int]:
    """Prompts right-aligned in slots [0, P) (P >= 2, so slot P-2 exists for the draft's two-token step);
    returns the state with the last prompt token pending at slot P-1, and P."""
    width = max(2, max(len(p) for p in prompts))
    batch = len(prompts)
    tokens = torch.full((batch, capacity), pad_token, dtype=torch.int64)
    valid = torch.zeros((batch, capacity), dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        tokens[row, width - len(prompt): width] = torch.tensor(prompt, dtype=torch.int64)
        valid[row, width - len(prompt): width] = True
    tokens, valid = tokens.to(device), valid.to(device)
    state = SlotState(tokens=tokens, valid=valid, batch_position=torch.tensor(width - 1, device=device),
                      pending=tokens[:, width - 1].clone())
    return state, width


def forward_slots(model, cache: StaticCache, state: SlotState, input_tokens: torch.Tensor,
                  start: torch.Tensor) -> torch.Tensor:
    """Run `input_tokens [B, n]` at slots start .. start+n-1 (validity already set by the caller);
    returns logits [B, n, V] in float32."""
    n = input_tokens.shape[1]
    slots = start + torch.arange(n, device=input_tokens.device)
    positions = (state.valid.cumsum(dim=1) - 1).index_select(1, slots).clamp_min(0)
    key_slots = torch.arange(state.capacity, device=input_tokens.device)
    visible = state.valid[:, None, :] & (key_slots[None, None, :] <= slots[None, :, None])
    visible |= key_slots[None, None, :] == slots[None, :, None]
    dtype = model.dtype
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    mask.masked_fill_(~visible, torch.finfo(dtype).min)
    seek(cache, start)
    out = model(input_ids=input_tokens, attention_mask=mask[:, None], position_ids=positions,
                past_key_values=cache, use_cache=True)
    return out.logits.float()


def write_tokens(state: SlotState, tokens: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    """Record tokens [B, n] at slots start.. as valid content; returns the slot indices."""
    slots = start + torch.arange(tokens.shape[1], device=tokens.device)
    state.tokens.index_copy_(1, slots, tokens)
    state.valid.index_fill_(1, slots, True)
    return slots


def prefill(model, cache: StaticCache, state: SlotState, width: int) -> None:
    """Every prompt slot but the last (the pending token) into the cache."""
    start = torch.zeros((), dtype=torch.int64, device=state.tokens.device)
    forward_slots(model, cache, state, state.tokens[:, : width - 1], start)


def sample_race(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """A token per row drawn from probs [..., V] as argmax p / E with E ~ Exp(1): sync-free, seeded."""
    noise = torch.empty_like(probs).exponential_(generator=generator)
    return (probs / noise.clamp_min(torch.finfo(torch.float32).tiny)).argmax(dim=-1)


def next_from_logits(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> torch.Tensor:
    if temperature <= 0:
        return logits.argmax(dim=-1)
    return sample_race((logits / temperature).softmax(dim=-1), generator)
