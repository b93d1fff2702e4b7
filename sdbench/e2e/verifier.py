"""The one adapter between the end-to-end loop and the rest of sdbench.

Every import of sdbench internals made by sdbench.e2e lives in this file (the package is being
restructured; only these lines need re-pointing): the public `sdbench.verify` for greedy decoding,
the public `sdbench.prob_verify` for sampling, the registry (names, availability), and `read_trace`.

Both verifiers are built once per run with static buffers (the batch never changes shape: finished
sequences stay in it), so a step allocates nothing:
- greedy: `sdbench.verify(draft_tokens, target_tokens, impl=..., out=...)`, any registered `verify`
  entry. On CPU tensors the API runs `torch_eager` whatever is asked (its documented rule), so on a
  CUDA device the same call runs the CUDA / Triton kernels.
- sampling: `sdbench.prob_verify(..., impl=..., uniforms=..., exponential_noise=...)` on buffers the loop
  refills each step (the API binds its prepared kernel to them once), in supplied randomness: uniforms
  and Exp(1) noise drawn from the loop's seeded generator, so every implementation sees the same draws
  and must emit the same tokens.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from sdbench import api as _api
from sdbench import registry as _registry
from sdbench.errors import SdbenchError
from sdbench.ops.workload import VerifyConfig, read_trace

__all__ = ["SdbenchError", "read_trace", "make_verifier", "implementation_names", "unavailable_reason",
           "Verifier"]

# (draft_tokens [B, γ], target_tokens [B, γ+1] or target_probs [B, γ+1, V], draft_probs [B, γ, V] or None,
#  generator) -> (accepted_lengths int64 [B], next_tokens int64 [B])
Verifier = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Generator | None],
                    tuple[torch.Tensor, torch.Tensor]]

_TINY = torch.finfo(torch.float32).tiny


def operation(temperature: float) -> str:
    return "verify" if temperature <= 0 else "prob_verify"


def implementation_names(temperature: float) -> list[str]:
    return [entry.name for entry in _registry.implementations(operation(temperature))]


def unavailable_reason(name: str, temperature: float, device: torch.device) -> str | None:
    """Why impl `name` cannot run on device (None: it can). CPU runs `verify` entries as torch_eager."""
    entry = _registry.get(operation(temperature), name)
    if operation(temperature) == "verify" and device.type not in entry.devices and device.type == "cpu":
        return None  # sdbench.verify runs torch_eager on CPU tensors for CUDA-only entries
    return entry.unavailable_reason(device)


def make_verifier(name: str, temperature: float, batch: int, gamma: int, vocab: int,
                  device: torch.device) -> Verifier:
    if temperature <= 0:
        return _greedy_verifier(name, batch, device)
    return _prob_verifier(name, batch, gamma, vocab, device)


def _greedy_verifier(name: str, batch: int, device: torch.device) -> Verifier:
    _registry.get("verify", name)  # an unknown name fails here, with the known ones listed
    out = {"accepted_lengths": torch.empty(batch, dtype=torch.int64, device=device),
           "has_mismatch": torch.empty(batch, dtype=torch.bool, device=device),
           "next_tokens": torch.empty(batch, dtype=torch.int64, device=device)}

    def verify(draft_tokens, target_tokens, draft_probs, generator):
        result = _api.verify(draft_tokens, target_tokens, impl=name, out=out)
        return result["accepted_lengths"], result["next_tokens"]

    return verify


def _prob_verifier(name: str, batch: int, gamma: int, vocab: int, device: torch.device) -> Verifier:
    entry = _registry.get("prob_verify", name)
    config = VerifyConfig(batch_size=batch, gamma=gamma, vocab_size=vocab, prob_dtype="float32")
    reason = entry.unavailable_reason(device, config)
    if reason is not None:
        raise SdbenchError(f"prob_verify impl {name!r} cannot run here: {reason} (try --verify-impl torch_eager)")
    # The step's buffers, kept for the whole run: sdbench.prob_verify binds its prepared kernel to them on
    # the first call (compile and warm-up once), and every later round only launches.
    draft_tokens_buffer = torch.zeros((batch, gamma), dtype=torch.int64, device=device)
    target_buffer = torch.full((batch, gamma + 1, vocab), 1.0 / vocab, device=device)
    draft_buffer = torch.full((batch, gamma, vocab), 1.0 / vocab, device=device)
    uniforms = torch.full((batch, gamma), 0.5, device=device)
    noise = torch.ones((batch, vocab), device=device)
    buffers = (draft_tokens_buffer, target_buffer, draft_buffer)
    _api.prob_verify(*buffers, impl=name, uniforms=uniforms, exponential_noise=noise)  # prepare now, not in round 1

    def verify(draft_tokens, target_probs, draft_probs, generator):
        draft_tokens_buffer.copy_(draft_tokens)
        target_buffer.copy_(target_probs)
        draft_buffer.copy_(draft_probs)
        uniforms.uniform_(generator=generator)
        noise.exponential_(generator=generator).clamp_min_(_TINY)
        result = _api.prob_verify(*buffers, impl=name, uniforms=uniforms, exponential_noise=noise)
        return result["accepted_lengths"], result["next_tokens"].long()

    return verify
