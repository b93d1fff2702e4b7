"""prob_verify in PyTorch: the eager reference as the `torch_eager` peer.

Supplied randomness: the reference itself. Fast: fresh uniforms and noise from PyTorch's default
generator before each call, as vLLM V1 draws them.
"""

from __future__ import annotations

import torch

from sdbench.ops.backends import ANY_DEVICE
from sdbench.ops.prob_verify.common import draw_torch_randomness
from sdbench.ops.prob_verify.reference import prob_verify
from sdbench.ops.prob_verify.workload import ProbWorkload
from sdbench.registry import Implementation, register


def _prepare_torch_eager(w: ProbWorkload):
    logprobs = w.config.logprobs
    if w.randomness == "supplied":
        return lambda: prob_verify(
            w.draft_tokens, w.target_probs, w.draft_probs, w.uniforms, w.exponential_noise, logprobs=logprobs
        )
    uniforms, noise = torch.empty_like(w.uniforms), torch.empty_like(w.exponential_noise)

    def run():
        draw_torch_randomness(uniforms, noise)
        return prob_verify(w.draft_tokens, w.target_probs, w.draft_probs, uniforms, noise, logprobs=logprobs)

    return run


register(Implementation(
    op="prob_verify", name="torch_eager", backend="torch", devices=ANY_DEVICE, peer=True,
    description="eager PyTorch: gather p, q at the drafts, cumprod of accepts, race at the stopping row",
    prepare=_prepare_torch_eager,
))
