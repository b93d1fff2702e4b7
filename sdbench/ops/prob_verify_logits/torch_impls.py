"""prob_verify_logits in PyTorch: the eager reference (softmax, then the probability rule) as a peer.

It runs both rules (config.rule: token | block), as `fused_logits` does.
"""

from __future__ import annotations

import torch

from sdbench.ops.backends import ANY_DEVICE
from sdbench.ops.prob_verify_logits.common import draw_torch_randomness
from sdbench.ops.prob_verify_logits.reference import prob_verify_logits
from sdbench.ops.prob_verify_logits.workload import LogitsWorkload
from sdbench.registry import Implementation, register


def _prepare_torch_eager(w: LogitsWorkload):
    rule = w.config.rule
    inputs = (w.draft_tokens, w.target_logits, w.draft_logits, w.target_temperature, w.draft_temperature)
    if w.randomness == "supplied":
        return lambda: prob_verify_logits(*inputs, w.uniforms, w.exponential_noise, rule=rule)
    uniforms, noise = torch.empty_like(w.uniforms), torch.empty_like(w.exponential_noise)

    def run():
        draw_torch_randomness(uniforms, noise)
        return prob_verify_logits(*inputs, uniforms, noise, rule=rule)

    return run


register(Implementation(
    op="prob_verify_logits", name="torch_eager", backend="torch", devices=ANY_DEVICE, peer=True,
    description="eager PyTorch: temperature softmax of every row, then the token rule (or block verification)",
    prepare=_prepare_torch_eager,
))
