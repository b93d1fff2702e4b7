"""Seeded ragged inputs and their oracle, built from the padded greedy workload.

The padded workload (sdbench.ops.workload) gives draft [B, γ_max], target [B, γ_max + 1] and k_i; each
request keeps the first γ_i drafts and γ_i + 1 targets. Its accepted length is min(k_i, γ_i): when
k_i < γ_i the padded mismatch is inside the kept range, otherwise every kept draft agrees. γ_i, unless
given, follows the config's `draft_lengths` (seeded): `uniform` in [0, γ_max] (zero-length requests
occur), `full` (every request drafts γ_max: the padded layout's case), `bimodal` (each request drafts
γ_max or 1 with equal odds: long and short drafts side by side, as adaptive block sizes produce).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sdbench.ops.workload import VerifyConfig, make_verify_workload


@dataclass
class RaggedVerifyWorkload:
    config: VerifyConfig  # gamma is γ_max
    draft_tokens: torch.Tensor  # [T]
    target_tokens: torch.Tensor  # [T + B]
    cu_num_draft_tokens: torch.Tensor  # [B] int64, inclusive
    draft_lengths: torch.Tensor  # [B] int64, γ_i
    accepted_lengths: torch.Tensor  # [B] int64, the oracle
    draft_kv: torch.Tensor | None = None  # [T, kv_dim], laid out like draft_tokens (kv_dim > 0: verify_pack_ragged)

    @property
    def device(self) -> torch.device:
        return self.draft_tokens.device


def draw_draft_lengths(cfg: VerifyConfig) -> torch.Tensor:
    """γ_i by cfg.draft_lengths, seeded by cfg (a stream of its own: the padded tokens do not move)."""
    generator = torch.Generator().manual_seed(cfg.seed + 7919)
    if cfg.draft_lengths == "full":
        return torch.full((cfg.batch_size,), cfg.gamma, dtype=torch.int64)
    if cfg.draft_lengths == "bimodal":
        long = torch.rand(cfg.batch_size, generator=generator) < 0.5
        return torch.where(long, cfg.gamma, 1).to(torch.int64)
    return torch.randint(0, cfg.gamma + 1, (cfg.batch_size,), generator=generator, dtype=torch.int64)


def flatten(draft: torch.Tensor, target: torch.Tensor, draft_lengths: torch.Tensor):
    """Padded [B, γ] / [B, γ+1] rows cut to γ_i / γ_i + 1 tokens and laid end to end (syncs: inputs only)."""
    gamma = draft.shape[1]
    lengths = draft_lengths.to(draft.device)
    positions = torch.arange(gamma + 1, device=draft.device)
    draft_flat = draft[positions[None, :gamma] < lengths[:, None]]
    target_flat = target[positions[None, :] <= lengths[:, None]]
    return draft_flat, target_flat, torch.cumsum(lengths, 0)


def make_ragged_workload(cfg: VerifyConfig, device: str | torch.device = "cpu",
                         draft_lengths: torch.Tensor | None = None) -> RaggedVerifyWorkload:
    """The padded workload's tokens cut to γ_i; with cfg.kv_dim > 0 its draft KV rows too (the padded
    workload draws its KV after its tokens, so the tokens are the same with or without KV)."""
    padded = make_verify_workload(cfg, device)
    lengths = (draw_draft_lengths(cfg) if draft_lengths is None else draft_lengths.to(torch.int64).cpu()).to(device)
    draft, target, cu = flatten(padded.draft_tokens, padded.target_tokens, lengths)
    draft_kv = None
    if padded.draft_kv is not None:
        kept = torch.arange(cfg.gamma, device=lengths.device)[None, :] < lengths[:, None]
        draft_kv = padded.draft_kv[kept]
    return RaggedVerifyWorkload(config=cfg, draft_tokens=draft, target_tokens=target, cu_num_draft_tokens=cu,
                                draft_lengths=lengths, accepted_lengths=torch.minimum(padded.accepted_lengths, lengths),
                                draft_kv=draft_kv)


def ragged_outputs(w: RaggedVerifyWorkload) -> dict[str, torch.Tensor]:
    """accepted_lengths, has_mismatch, next_tokens for w's batch (every ragged kernel writes these)."""
    batch, device = w.cu_num_draft_tokens.shape[0], w.device
    return {
        "accepted_lengths": torch.empty(batch, dtype=torch.int64, device=device),
        "has_mismatch": torch.empty(batch, dtype=torch.bool, device=device),
        "next_tokens": torch.empty(batch, dtype=w.target_tokens.dtype, device=device),
    }

