"""The definition of verification from logits, in eager PyTorch, and a float64 twin.

From logits to distributions, per request b and row r (float32 arithmetic for any logits dtype):
- T_b > 0: z = logits.float() · (1 / T_b) (the reciprocal rounded to float32 once), p = softmax(z);
- T_b = 0 (greedy): p = one-hot(argmax logits), the first index on ties.
Then the probability rules, on the same supplied randomness as sdbench.ops.prob_verify:
- rule "token": Leviathan's token-wise rule, sdbench.ops.prob_verify.reference.prob_verify (accept
  draft i iff u_i·q_i(x_i) < p_i(x_i); the residual race at the first rejection; the bonus race).
  For a greedy target this is greedy verification: x_i is accepted iff it is the argmax, and the next
  token is row k's argmax. The draft's distribution does not enter it, so q := 0 for such a request
  (then u·0 < p iff p = 1, for every u; before, u·q < 1 gave the same for u in [0, 1) and any q ≤ 1), and a
  kernel need not read those draft logits (fused_logits does not). The block rule keeps q (its weights
  p/q need it).
- rule "block": Sun et al., "Block Verification Accelerates Speculative Decoding" (ICLR 2025),
  sdbench.ops.prob_verify.reference.block_stop (η_i = uniforms[:, i-1]), on the same p and q: the
  probability reference's prob_verify(..., rule="block"), so both inputs share one definition.

Tokens from a kernel equal this float32 definition except where a draw is a near-tie at float32
rounding (|u·q - p|, |η_i - h_i| or the top two race keys within ~1e-6 relative): a kernel computes
the same softmax (and the block rule's residual masses r_i) with a different summation order, so p
and h differ in their last bits.
"""

from __future__ import annotations

import torch

from sdbench.ops.prob_verify.reference import prob_verify


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
    if rule == "token":  # a greedy target's drafts stand or fall by its argmax alone (the module's docstring)
        draft_probs = torch.where((target_temperature == 0)[:, None, None], 0.0, draft_probs)
    return prob_verify(draft_tokens, target_probs, draft_probs, uniforms, exponential_noise, rule=rule,
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


def expected_accepted_lengths(w, draws: int, generator: torch.Generator | None = None) -> dict[str, float]:
    """Expected accepted drafts per sequence under each rule on w's logits and temperatures: `draws` fresh
    draft sequences per request (x_i ~ q_i, as the workload draws them) and, given the drafts, the exact
    expectation over the accept uniforms, in float64:
    - token: Σ_{i=1..γ} Π_{j<i} min(1, p_j(x_j)/q_j(x_j))  (P(k >= i));
    - block: Σ_{i=1..γ} (1 - Π_{j=i..γ} (1 - h_j))  (P(τ >= i), τ the largest i with η_i < h_i), with
      w_i, r_i, h_i as in sdbench.ops.prob_verify.reference.block_stop.
    A single draw of drafts and uniforms (the workload's own) is one sample of these: at b = 1 its
    accepted length is 0..γ, and block verification beats token-wise only in expectation. Peak memory:
    p, q and one [B·draws, V] temporary in float64."""
    p = temperature_probs(w.target_logits, w.target_temperature, torch.float64)  # [B, γ+1, V]
    q = temperature_probs(w.draft_logits, w.draft_temperature, torch.float64)  # [B, γ, V]
    batch, gamma, vocab = q.shape
    drafts = torch.multinomial(q.reshape(batch * gamma, vocab), draws, replacement=True, generator=generator)
    drafts = drafts.view(batch, gamma, draws).permute(0, 2, 1)  # [B, draws, γ]
    p_at = torch.gather(p[:, None, :gamma].expand(batch, draws, gamma, vocab), 3, drafts[..., None])[..., 0]
    q_at = torch.gather(q[:, None].expand(batch, draws, gamma, vocab), 3, drafts[..., None])[..., 0]
    ratio = p_at / q_at  # q_at > 0: every draft was drawn from q
    token = torch.cumprod(ratio.clamp(max=1.0), dim=2).sum(dim=2)
    weights = [torch.ones_like(ratio[..., 0])]  # w_0 .. w_γ
    for j in range(gamma):
        weights.append(torch.clamp(weights[-1] * ratio[..., j], max=1.0))
    h = []
    for i in range(1, gamma):
        mass = (weights[i][..., None] * p[:, None, i] - q[:, None, i]).clamp(min=0.0).sum(dim=2)
        denominator = mass + 1.0 - weights[i]
        h.append(torch.where(denominator > 0, mass / torch.where(denominator > 0, denominator, 1.0), 1.0))
    h.append(weights[gamma])
    rejected_from = torch.cumprod(torch.stack([1.0 - value for value in reversed(h)], dim=2), dim=2)  # Π_{j=i..γ}
    block = (1.0 - rejected_from).sum(dim=2)
    return {"token": float(token.mean()), "block": float(block.mean())}
