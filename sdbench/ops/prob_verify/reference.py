"""The definition of probabilistic (Leviathan) verification, in eager PyTorch, and a float64 twin."""

from __future__ import annotations

import torch

# --- prob_verify: probabilistic (Leviathan) verification ---------------------------------------
# Outputs: accepted_lengths int64 [B], next_tokens [B] and output_tokens [B, γ+1] (token dtype; the
# accepted drafts, then the next token, then -1). With intermediates=True also accept_probs float32
# [B, γ] = min(1, p(x)/q(x)) at each draft token (1 where q = 0 < p, 0 where both are 0): a float
# intermediate some kernels expose, compared within PROB_FLOAT_ATOL of the input dtype.
#
# The draws are the definition every implementation reproduces bit for bit in supplied mode:
# - accept draft i iff u_i · q_i(x_i) < p_i(x_i) (float32 multiply, strict compare);
# - k = the first rejected position (γ when none): the cumulative product of the accept flags;
# - next token = exponential race at row k over w = max(0, p_k - q_k) (q_γ := 0, so the bonus race
#   is over p_γ): argmax over {w > 0} of w / E, first index on ties. The race needs no normalising
#   sum: P(argmax w_j / E_j = j) = w_j / Σ w for iid E ~ Exp(1). When w is 0 everywhere (impossible
#   in exact arithmetic at a rejected row, possible after rounding) the race falls back to p / E.

PROB_FLOAT_INTERMEDIATES = ("accept_probs",)
PROB_FLOAT_ATOL = {"float32": 1e-5, "bfloat16": 1e-3}  # max |kernel - reference| per input dtype


class ToleratedOutputs(dict):
    """Reference outputs plus `float_atol` (name -> absolute tolerance) for their float
    intermediates, which implementations may leave out (parity.compare reads it)."""

    def __init__(self, outputs: dict[str, torch.Tensor], float_atol: dict[str, float]) -> None:
        super().__init__(outputs)
        self.float_atol = float_atol


def prob_race(target_row: torch.Tensor, draft_row: torch.Tensor, exponential_noise: torch.Tensor) -> torch.Tensor:
    """Residual draw at one row per sequence: int64 [B] token ids (all inputs [B, V], same float dtype)."""
    residual = (target_row - draft_row).clamp_min(0.0)
    positive = residual > 0
    residual_key = torch.where(positive, residual / exponential_noise, torch.full_like(residual, -1.0))
    fallback_key = target_row / exponential_noise
    return torch.where(positive.any(dim=1), residual_key.argmax(dim=1), fallback_key.argmax(dim=1))


def prob_output_tokens(
    draft_tokens: torch.Tensor, accepted_lengths: torch.Tensor, next_tokens: torch.Tensor
) -> torch.Tensor:
    """[B, γ+1]: draft tokens before k, the next token at k, -1 after (in the draft token dtype)."""
    batch, gamma = draft_tokens.shape
    positions = torch.arange(gamma + 1, device=draft_tokens.device)[None, :]
    padded = torch.cat([draft_tokens, draft_tokens.new_zeros((batch, 1))], dim=1)
    k = accepted_lengths[:, None]
    after = torch.full_like(padded, -1)
    return torch.where(positions < k, padded, torch.where(positions == k, next_tokens[:, None].to(padded.dtype), after))


def prob_accept_probs(target_at_draft: torch.Tensor, draft_at_draft: torch.Tensor) -> torch.Tensor:
    """min(1, p/q) at the draft tokens; 1 where q = 0 < p and 0 where both are 0."""
    safe_q = torch.where(draft_at_draft > 0, draft_at_draft, torch.ones_like(draft_at_draft))
    ratio = torch.clamp(target_at_draft / safe_q, max=1.0)
    return torch.where(draft_at_draft > 0, ratio, (target_at_draft > 0).to(ratio.dtype))


def prob_verify(
    draft_tokens: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    uniforms: torch.Tensor,
    exponential_noise: torch.Tensor,
    *,
    logprobs: bool = False,
    intermediates: bool = False,
    compute_dtype: torch.dtype = torch.float32,
) -> dict[str, torch.Tensor]:
    """Leviathan rejection sampling in eager PyTorch: the definition and the `torch_eager` peer.

    draft_tokens [B, γ]; target_probs p [B, γ+1, V]; draft_probs q [B, γ, V] (probabilities, or
    log-probs when logprobs); uniforms [B, γ]; exponential_noise [B, V]. Arithmetic in
    compute_dtype (float32, even for bfloat16 inputs). Sync-free: V is swept at row k only.
    """
    batch, gamma = draft_tokens.shape
    vocab = target_probs.shape[2]

    def decode(values: torch.Tensor) -> torch.Tensor:
        values = values.to(compute_dtype)
        return values.exp() if logprobs else values

    tokens = draft_tokens.long()[:, :, None]
    target_at_draft = decode(target_probs[:, :gamma].gather(2, tokens).squeeze(2))
    draft_at_draft = decode(draft_probs.gather(2, tokens).squeeze(2))
    accepted = uniforms.to(compute_dtype) * draft_at_draft < target_at_draft
    accepted_lengths = accepted.to(torch.int64).cumprod(dim=1).sum(dim=1)

    row = accepted_lengths[:, None, None].expand(batch, 1, vocab)
    target_row = decode(target_probs.gather(1, row).squeeze(1))
    draft_row = decode(draft_probs.gather(1, row.clamp(max=gamma - 1)).squeeze(1))
    draft_row = torch.where((accepted_lengths < gamma)[:, None], draft_row, torch.zeros_like(draft_row))
    next_tokens = prob_race(target_row, draft_row, exponential_noise.to(compute_dtype)).to(draft_tokens.dtype)

    outputs = {
        "accepted_lengths": accepted_lengths,
        "next_tokens": next_tokens,
        "output_tokens": prob_output_tokens(draft_tokens, accepted_lengths, next_tokens),
    }
    if intermediates:
        outputs["accept_probs"] = prob_accept_probs(target_at_draft, draft_at_draft).float()
    return outputs


def prob_verify_float64(
    draft_tokens: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    uniforms: torch.Tensor,
    exponential_noise: torch.Tensor,
    *,
    logprobs: bool = False,
) -> dict[str, torch.Tensor]:
    """The same definition in float64 on the CPU: the yardstick for float tolerances.

    Tokens can differ from the float32 reference only where a draw is a near-tie (|u·q - p| or the
    top two race keys within float32 rounding), which has probability ~1e-7 per draw.
    """
    cpu = [t.cpu() for t in (draft_tokens, target_probs, draft_probs, uniforms, exponential_noise)]
    return prob_verify(*cpu, logprobs=logprobs, intermediates=True, compute_dtype=torch.float64)
