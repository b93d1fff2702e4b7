"""What the from-logits implementations share: outputs, randomness, the softmax the probability peers pay."""

from __future__ import annotations

import torch

from sdbench.ops.prob_verify.common import allocate_outputs, draw_torch_randomness, warm_up
from sdbench.ops.prob_verify_logits.workload import LogitsConfig

__all__ = ["allocate_outputs", "draw_torch_randomness", "warm_up", "token_rule_only", "SoftmaxBuffers"]


def token_rule_only(cfg: LogitsConfig) -> str | None:
    """`supports` of the token-rule designs: block verification runs in `fused_logits` and `torch_eager`."""
    if getattr(cfg, "rule", "token") != "token":
        return (f"implements the token rule only (rule={cfg.rule!r}: use fused_logits, or torch_eager, for block "
                "verification)")
    return None


class SoftmaxBuffers:
    """Float32 probability buffers p [B, γ+1, V] and q [B, γ, V] and the softmax that fills them:
    z = logits·(1/T) (one read of the logits, one float32 write), softmax(z) (read z, write p), and
    for greedy requests p := one-hot(argmax logits) (an argmax pass and a masked fill). This is what
    a caller of a probability sampler (FlashInfer, sdbench's prob `fused`) runs first, with no
    allocation per call; reference.temperature_probs is the same definition."""

    def __init__(self, target_logits: torch.Tensor, draft_logits: torch.Tensor) -> None:
        self.target_probs = torch.empty(target_logits.shape, dtype=torch.float32, device=target_logits.device)
        self.draft_probs = torch.empty(draft_logits.shape, dtype=torch.float32, device=draft_logits.device)
        self._z = torch.empty_like(self.target_probs)

    def fill(self, target_logits, draft_logits, target_temperature, draft_temperature) -> None:
        self._fill(target_logits, target_temperature, self.target_probs)
        self._fill(draft_logits, draft_temperature, self.draft_probs)

    def _fill(self, logits: torch.Tensor, temperature: torch.Tensor, out: torch.Tensor) -> None:
        greedy = temperature == 0
        inverse = torch.where(greedy, 1.0, 1.0 / torch.where(greedy, 1.0, temperature))
        z = self._z[:, : logits.shape[1]]
        torch.mul(logits, inverse[:, None, None], out=z)
        torch.ops.aten._softmax.out(z, 2, False, out=out)
        argmax = logits.argmax(dim=2, keepdim=True)
        mask = greedy[:, None, None]
        kept = torch.where(mask, 1.0, out.gather(2, argmax))
        out.masked_fill_(mask, 0.0).scatter_(2, argmax, kept)
