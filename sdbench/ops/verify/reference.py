"""The definition of greedy verification, in eager PyTorch (device-agnostic).

Outputs, shared by every implementation: accepted_lengths int64 [B], has_mismatch bool [B],
next_tokens [B] (token dtype). Written the idiomatic eager way on purpose: this is also the
`torch_eager` peer every kernel's speedup is quoted against.
"""

from __future__ import annotations

import torch


def verify(draft_tokens: torch.Tensor, target_tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """Greedy verification: accept draft tokens up to the first disagreement with the target.

    k_i = index of the first position where draft != target (γ when none); the next token is the
    target's token at k_i, which is the bonus token at γ when everything was accepted.
    """
    gamma = draft_tokens.shape[1]
    mismatch = draft_tokens != target_tokens[:, :gamma]
    has_mismatch = mismatch.any(dim=1)
    # argmax returns the first maximal index, i.e. the first mismatch (0 when there is none).
    first_mismatch = mismatch.to(torch.uint8).argmax(dim=1)
    accepted_lengths = torch.where(has_mismatch, first_mismatch, torch.full_like(first_mismatch, gamma))
    next_tokens = target_tokens.gather(1, accepted_lengths[:, None]).squeeze(1)
    return {"accepted_lengths": accepted_lengths, "has_mismatch": has_mismatch, "next_tokens": next_tokens}
