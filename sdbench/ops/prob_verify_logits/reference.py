"""The definition of verification from logits, in eager PyTorch, and a float64 twin.

From logits to distributions, per request b and row r (float32 arithmetic for any logits dtype):
- T_b > 0: z = logits.float() · (1 / T_b) (the reciprocal rounded to float32 once), p = softmax(z);
- T_b = 0 (greedy): p = one-hot(argmax logits), the first index on ties.
Then the probability rules, on the same supplied randomness as sdbench.ops.prob_verify:
- rule "token": Leviathan's token-wise rule, sdbench.ops.prob_verify.reference.prob_verify (accept
  draft i iff u_i·q_i(x_i) < p_i(x_i); the residual race at the first rejection; the bonus race).
  For a greedy target this is greedy verification: p_i(x_i) is 1 iff x_i = argmax, and the race at
  row k over max(0, onehot - q) picks the argmax.
- rule "block": Sun et al., "Block Verification Accelerates Speculative Decoding" (ICLR 2025),
  `block_verify` below, with η_i = uniforms[:, i-1].

Tokens from a kernel equal this float32 definition except where a draw is a near-tie at float32
rounding (|u·q - p| or the top two race keys within ~1e-6 relative): a kernel computes the same
softmax with a different summation order, so p differs in its last bits.
"""

from __future__ import annotations

import torch

from sdbench.ops.prob_verify.reference import prob_output_tokens, prob_race, prob_verify


def temperature_probs(logits: torch.Tensor, temperature: torch.Tensor,
                      compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """p [B, R, V] in compute_dtype from logits [B, R, V] and temperature [B] (0 = one-hot argmax)."""
    temperature = temperature.to(compute_dtype)
    greedy = temperature == 0
    inverse = torch.where(greedy, torch.ones_like(temperature), 1.0 / torch.where(greedy, 1.0, temperature))
    z = logits.to(compute_dtype) * inverse[:, None, None]
    probs = z.softmax(dim=2)
    one_hot = torch.zeros_like(probs).scatter_(2, logits.argmax(dim=2, keepdim=True), 1.0)
    return torch.where(greedy[:, None, None], one_hot, probs)


def block_verify(draft_tokens: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor,
                 uniforms: torch.Tensor, exponential_noise: torch.Tensor) -> dict[str, torch.Tensor]:
    """Block verification (Sun et al. 2025, Algorithm 2) on probabilities, one position at a time.

    p [B, γ+1, V] (row i: the target's distribution of token i given the i drafts before it), q
    [B, γ, V], drafts x [B, γ], η_i = uniforms[:, i-1] for i = 1..γ. With weight w_0 = 1:
        w_i = min(1, w_{i-1} · p_{i-1}(x_{i-1}) / q_{i-1}(x_{i-1}))
        r_i = Σ_x max(0, w_i·p_i(x) - q_i(x))                     (i < γ)
        h_i = r_i / (r_i + 1 - w_i)  (i < γ; 1 where that is 0/0),  h_γ = w_γ
        τ = the largest i in 1..γ with η_i < h_i, else 0 (every position is tested, none stops it)
    The τ drafts are kept; the next token is drawn from max(0, w_τ·p_τ - q_τ) (from p_γ when τ = γ)
    by the exponential race of prob_verify. Outputs as prob_verify (accepted_lengths = τ).
    """
    batch, gamma = draft_tokens.shape
    dtype = target_probs.dtype
    tokens = draft_tokens.long()[:, :, None]
    target_at = target_probs[:, :gamma].gather(2, tokens).squeeze(2)
    draft_at = draft_probs.gather(2, tokens).squeeze(2)
    weight = torch.ones(batch, dtype=dtype, device=target_probs.device)
    weights = [weight]
    stop = torch.zeros(batch, dtype=torch.int64, device=target_probs.device)
    for i in range(1, gamma + 1):
        ratio = torch.where(draft_at[:, i - 1] > 0, target_at[:, i - 1] / draft_at[:, i - 1].clamp_min(1e-300),
                            torch.where(target_at[:, i - 1] > 0, torch.inf, 0.0))
        weight = torch.clamp(weight * ratio, max=1.0).nan_to_num(0.0)
        weights.append(weight)
        if i < gamma:
            residual = (weight[:, None] * target_probs[:, i] - draft_probs[:, i]).clamp_min(0).sum(dim=1)
            denominator = residual + (1 - weight)
            h = torch.where(denominator > 0, residual / torch.where(denominator > 0, denominator, 1.0), 1.0)
        else:
            h = weight
        stop = torch.where(uniforms[:, i - 1].to(dtype) < h, i, stop)
    weights = torch.stack(weights, dim=1)  # [B, γ+1]
    w_stop = weights.gather(1, stop[:, None]).squeeze(1)
    rows = torch.arange(batch, device=target_probs.device)
    target_row = target_probs[rows, stop]
    draft_row = torch.where((stop < gamma)[:, None], draft_probs[rows, stop.clamp(max=gamma - 1)],
                            torch.zeros_like(target_row))
    scaled_target = torch.where((stop < gamma)[:, None], w_stop[:, None] * target_row, target_row)
    next_tokens = prob_race(scaled_target, draft_row, exponential_noise.to(dtype)).to(draft_tokens.dtype)
    return {
        "accepted_lengths": stop,
        "next_tokens": next_tokens,
        "output_tokens": prob_output_tokens(draft_tokens, stop, next_tokens),
    }


def prob_verify_logits(
    draft_tokens: torch.Tensor,
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor,
    target_temperature: torch.Tensor,
    draft_temperature: torch.Tensor,
    uniforms: torch.Tensor,
    exponential_noise: torch.Tensor,
    *,
    rule: str = "token",
    compute_dtype: torch.dtype = torch.float32,
) -> dict[str, torch.Tensor]:
    """Verification from logits: temperature softmax (T = 0: one-hot argmax), then the rule.

    The eager peer (`torch_eager`) is this function: it materialises p and q in compute_dtype.
    """
    target_probs = temperature_probs(target_logits, target_temperature, compute_dtype)
    draft_probs = temperature_probs(draft_logits, draft_temperature, compute_dtype)
    if rule == "block":
        return block_verify(draft_tokens, target_probs, draft_probs, uniforms.to(compute_dtype),
                            exponential_noise.to(compute_dtype))
    return prob_verify(draft_tokens, target_probs, draft_probs, uniforms, exponential_noise,
                       compute_dtype=compute_dtype)


def prob_verify_logits_float64(draft_tokens, target_logits, draft_logits, target_temperature, draft_temperature,
                               uniforms, exponential_noise, *, rule: str = "token") -> dict[str, torch.Tensor]:
    """The same definition in float64 on the CPU (the yardstick for near-tie disagreements)."""
    cpu = [t.cpu() for t in (draft_tokens, target_logits, draft_logits, target_temperature, draft_temperature,
                             uniforms, exponential_noise)]
    return prob_verify_logits(*cpu, rule=rule, compute_dtype=torch.float64)


def reference_outputs(w, rule: str | None = None) -> dict[str, torch.Tensor]:
    """The reference on a LogitsWorkload in supplied randomness (rule defaults to the workload's)."""
    if w.randomness != "supplied":
        raise ValueError("prob_verify_logits parity needs supplied randomness: fast-mode draws have no reference")
    return prob_verify_logits(w.draft_tokens, w.target_logits, w.draft_logits, w.target_temperature,
                              w.draft_temperature, w.uniforms, w.exponential_noise, rule=rule or w.config.rule)


def mean_accepted_length(accepted_lengths: torch.Tensor) -> float:
    """Mean accepted drafts per sequence (host sync: a report statistic, never in a timed path)."""
    return float(accepted_lengths.double().mean())


def mean_accepted_length_by_rule(w) -> dict[str, float]:
    """Mean accepted drafts per sequence under each rule on the same workload and the same supplied
    randomness (the report's column: block verification is never worse in expectation)."""
    return {rule: mean_accepted_length(reference_outputs(w, rule)["accepted_lengths"]) for rule in ("token", "block")}
