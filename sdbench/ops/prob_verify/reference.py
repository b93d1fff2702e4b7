"""The definition of probabilistic (Leviathan) verification, in eager PyTorch, and a float64 twin."""

from __future__ import annotations

import torch

from sdbench.ops.input_contract import TOKEN_OUT_OF_RANGE

# --- prob_verify: probabilistic verification, two acceptance rules ------------------------------
# rule "token" (the default): Leviathan's token-wise rule, below. rule "block": Sun et al., "Block
# Verification Accelerates Speculative Decoding" (ICLR 2025), see `block_stop`: the same gathers of
# p and q at the draft tokens, another stopping position, and the race at the stop over a residual
# whose target row is scaled by the block weight. Both emit tokens distributed exactly as p.
# Outputs: accepted_lengths int64 [B], next_tokens [B] and output_tokens [B, γ+1] (token dtype; the
# accepted drafts, then the next token, then -1), error_flags int32 [B] (see 'Bad tokens' below).
# With intermediates=True also accept_probs float32 [B, γ] = min(1, p(x)/q(x)) at each draft token
# (1 where q = 0 < p, 0 where both are 0): a float intermediate some kernels expose, compared within
# PROB_FLOAT_ATOL of the input dtype.
#
# The draws are the definition every implementation reproduces bit for bit in supplied mode:
# - accept draft i iff u_i · q_i(x_i) < p_i(x_i) (float32 multiply, strict compare);
# - k = the first rejected position (γ when none): the cumulative product of the accept flags;
# - next token = exponential race at row k over w = max(0, p_k - q_k) (q_γ := 0, so the bonus race
#   is over p_γ): argmax over {w > 0} of w / E, first index on ties. The race needs no normalising
#   sum: P(argmax w_j / E_j = j) = w_j / Σ w for iid E ~ Exp(1).
#
# Degenerate rows (the one definition; every implementation agrees, and no token is ever outside
# [0, V)). The race has three tiers, each used only when the ones before it are empty:
#   1. columns with w > 0 (NaN is not > 0; +inf is, and ties go to the first index): key w / E;
#   2. columns with p > 0 (w is 0 everywhere: impossible in exact arithmetic at a rejected row,
#      possible after rounding, and the rule for unnormalised rows): key p / E;
#   3. every column (p has no positive entry: all zero, negative or NaN): key 1 / E, i.e. the first
#      index of the smallest E, a uniform draw over [0, V).
# Bad tokens (sdbench.ops.input_contract): a draft token outside [0, V) has p = q = 0 there, so it
# is rejected at its position, its accept_prob is 0, and error_flags[b] gets TOKEN_OUT_OF_RANGE. The
# outputs stay defined (the race at the first rejection reads whole rows, never a token's column).
# Under the block rule p = q = 0 makes the weight 0 from that position on, so the block stops before it.

RULES = ("token", "block")  # Leviathan's token-wise acceptance; Sun et al.'s block verification
PROB_FLOAT_INTERMEDIATES = ("accept_probs",)
PROB_FLOAT_ATOL = {"float32": 1e-5, "bfloat16": 1e-3}  # max |kernel - reference| per input dtype


class ToleratedOutputs(dict):
    """Reference outputs plus `float_atol` (name -> absolute tolerance) for their float
    intermediates, which implementations may leave out (parity.compare reads it)."""

    def __init__(self, outputs: dict[str, torch.Tensor], float_atol: dict[str, float]) -> None:
        super().__init__(outputs)
        self.float_atol = float_atol


def prob_race(target_row: torch.Tensor, draft_row: torch.Tensor, exponential_noise: torch.Tensor) -> torch.Tensor:
    """Residual draw at one row per sequence: int64 [B] token ids in [0, V) (all inputs [B, V], same
    float dtype), with the three tiers of the degenerate-row rule above."""
    residual = (target_row - draft_row).clamp_min(0.0)
    positive = residual > 0
    residual_key = torch.where(positive, residual / exponential_noise, torch.full_like(residual, -1.0))
    # tier 2 keys are >= 0, tier 3 keys (-E) < 0: one argmax takes tier 2 when p has a positive entry
    fallback_key = torch.where(target_row > 0, target_row / exponential_noise, -exponential_noise)
    return torch.where(positive.any(dim=1), residual_key.argmax(dim=1), fallback_key.argmax(dim=1))


def draft_token_errors(draft_tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """error_flags int32 [B]: TOKEN_OUT_OF_RANGE where any draft token of the sequence is outside [0, V)."""
    bad = ((draft_tokens < 0) | (draft_tokens >= vocab)).any(dim=1)
    return bad.to(torch.int32) * TOKEN_OUT_OF_RANGE


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
    """The probability that the accept test passes: min(1, p/q) at the draft tokens; 1 where q = 0 < p
    and 0 where both are 0; 0 where p/q is negative or NaN (degenerate inputs: the test never passes)."""
    safe_q = torch.where(draft_at_draft > 0, draft_at_draft, torch.ones_like(draft_at_draft))
    ratio = target_at_draft / safe_q
    ratio = torch.where(ratio > 0, ratio, torch.zeros_like(ratio)).clamp(max=1.0)
    return torch.where(draft_at_draft > 0, ratio, (target_at_draft > 0).to(ratio.dtype))


def block_stop(target_at_draft: torch.Tensor, draft_at_draft: torch.Tensor, target_rows, draft_rows,
               uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Block verification's stopping position τ (int64 [B]) and weight w_τ (Sun et al. 2025, Algorithm 2).

    p_i(x_i), q_i(x_i) [B, γ] at the draft tokens (0 where a token is out of range), target_rows(i) and
    draft_rows(i) the decoded rows p_i, q_i [B, V] (only i = 1..γ-1 are read), η_i = uniforms[:, i-1]
    for i = 1..γ. With w_0 = 1:
        w_i = min(1, w_{i-1} · p_{i-1}(x_{i-1}) / q_{i-1}(x_{i-1}))   (p/q := +inf where q = 0 < p, 0 where
              both are 0; a NaN product, 0 · inf, is 0)
        r_i = Σ_x max(0, w_i·p_i(x) - q_i(x))                        (i < γ)
        h_i = r_i / (r_i + (1 - w_i))  (i < γ; 1 where that denominator is 0),  h_γ = w_γ
        τ = the largest i in 1..γ with η_i < h_i, else 0 (every position is tested; none ends the block).
    The τ drafts are kept and the next token is raced over max(0, w_τ·p_τ - q_τ) (over p_γ when τ = γ).
    """
    batch, gamma = target_at_draft.shape
    dtype, device = target_at_draft.dtype, target_at_draft.device
    positive_q = draft_at_draft > 0
    ratio = torch.where(positive_q, target_at_draft / torch.where(positive_q, draft_at_draft, 1.0),
                        torch.where(target_at_draft > 0, torch.inf, 0.0).to(dtype))
    weight = torch.ones(batch, dtype=dtype, device=device)
    weights = [weight]
    stop = torch.zeros(batch, dtype=torch.int64, device=device)
    for i in range(1, gamma + 1):
        weight = (weight * ratio[:, i - 1]).clamp(max=1.0).nan_to_num(nan=0.0)
        weights.append(weight)
        if i < gamma:
            residual = (weight[:, None] * target_rows(i) - draft_rows(i)).clamp_min(0).sum(dim=1)
            denominator = residual + (1 - weight)
            h = torch.where(denominator > 0, residual / torch.where(denominator > 0, denominator, 1.0), 1.0)
        else:
            h = weight
        stop = torch.where(uniforms[:, i - 1].to(dtype) < h, i, stop)
    return stop, torch.stack(weights, dim=1).gather(1, stop[:, None]).squeeze(1)


def prob_verify(
    draft_tokens: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    uniforms: torch.Tensor,
    exponential_noise: torch.Tensor,
    *,
    rule: str = "token",
    logprobs: bool = False,
    intermediates: bool = False,
    compute_dtype: torch.dtype = torch.float32,
) -> dict[str, torch.Tensor]:
    """Probabilistic verification in eager PyTorch: the definition and the `torch_eager` peer.

    draft_tokens [B, γ]; target_probs p [B, γ+1, V]; draft_probs q [B, γ, V] (probabilities, or
    log-probs when logprobs); uniforms [B, γ]; exponential_noise [B, V]. rule "token" (Leviathan) or
    "block" (Sun et al., `block_stop`). Arithmetic in compute_dtype (float32, even for bfloat16 inputs).
    Sync-free: the token rule sweeps V at row k only, the block rule at rows 1..γ-1 and k.
    Also returns error_flags int32 [B] (sdbench.ops.input_contract): it never raises on bad tokens.
    """
    if rule not in RULES:
        raise ValueError(f"rule must be one of {', '.join(RULES)}, got {rule!r}")
    batch, gamma = draft_tokens.shape
    vocab = target_probs.shape[2]

    def decode(values: torch.Tensor) -> torch.Tensor:
        values = values.to(compute_dtype)
        return values.exp() if logprobs else values

    in_range = (draft_tokens >= 0) & (draft_tokens < vocab)
    tokens = draft_tokens.long().clamp(0, vocab - 1)[:, :, None]  # gathered, then zeroed where out of range
    zero = torch.zeros((), dtype=compute_dtype, device=draft_tokens.device)
    target_at_draft = torch.where(in_range, decode(target_probs[:, :gamma].gather(2, tokens).squeeze(2)), zero)
    draft_at_draft = torch.where(in_range, decode(draft_probs.gather(2, tokens).squeeze(2)), zero)
    if rule == "block":
        accepted_lengths, stop_weight = block_stop(target_at_draft, draft_at_draft,
                                                   lambda i: decode(target_probs[:, i]),
                                                   lambda i: decode(draft_probs[:, i]), uniforms)
    else:
        accepted = uniforms.to(compute_dtype) * draft_at_draft < target_at_draft
        accepted_lengths = accepted.to(torch.int64).cumprod(dim=1).sum(dim=1)

    row = accepted_lengths[:, None, None].expand(batch, 1, vocab)
    target_row = decode(target_probs.gather(1, row).squeeze(1))
    has_draft = (accepted_lengths < gamma)[:, None]
    draft_row = decode(draft_probs.gather(1, row.clamp(max=gamma - 1)).squeeze(1))
    draft_row = torch.where(has_draft, draft_row, torch.zeros_like(draft_row))
    if rule == "block":  # the block rule's residual max(0, w_τ·p_τ - q_τ); the bonus row is p_γ as it is
        target_row = torch.where(has_draft, stop_weight[:, None] * target_row, target_row)
    next_tokens = prob_race(target_row, draft_row, exponential_noise.to(compute_dtype)).to(draft_tokens.dtype)

    outputs = {
        "accepted_lengths": accepted_lengths,
        "next_tokens": next_tokens,
        "output_tokens": prob_output_tokens(draft_tokens, accepted_lengths, next_tokens),
        "error_flags": draft_token_errors(draft_tokens, vocab),
    }
    if intermediates:  # the token rule's accept probability (both rules: a property of p, q at the drafts)
        outputs["accept_probs"] = prob_accept_probs(target_at_draft, draft_at_draft).float()
    return outputs


def prob_verify_float64(
    draft_tokens: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    uniforms: torch.Tensor,
    exponential_noise: torch.Tensor,
    *,
    rule: str = "token",
    logprobs: bool = False,
) -> dict[str, torch.Tensor]:
    """The same definition in float64 on the CPU: the yardstick for float tolerances.

    Tokens can differ from the float32 reference only where a draw is a near-tie (|u·q - p| or the
    top two race keys within float32 rounding), which has probability ~1e-7 per draw.
    """
    cpu = [t.cpu() for t in (draft_tokens, target_probs, draft_probs, uniforms, exponential_noise)]
    return prob_verify(*cpu, rule=rule, logprobs=logprobs, intermediates=True, compute_dtype=torch.float64)
