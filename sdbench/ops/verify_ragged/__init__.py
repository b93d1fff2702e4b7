"""verify over ragged draft lengths γ_i, in the flattened layout serving engines use.

Inputs (B requests, T = Σ γ_i draft tokens):
    draft_tokens         [T]      request i's drafts at [cu[i-1], cu[i])          (cu[-1] := 0)
    target_tokens        [T + B]  request i's γ_i + 1 target tokens at [cu[i-1] + i, cu[i] + i + 1)
    cu_num_draft_tokens  [B]      int64, inclusive prefix sum of γ_i (vLLM's `cu_num_draft_tokens`)
Outputs, as for `verify`: accepted_lengths k_i (0 ≤ k_i ≤ γ_i), has_mismatch (k_i < γ_i), next_tokens
(the target's token at position k_i of request i: the correction, or the bonus token when k_i = γ_i).
γ_i = 0 is allowed: k_i = 0 and the next token is the request's one target token.

Bad offsets (cu decreasing, or past T) never read out of bounds: every kernel clamps each request's
range to [0, T] (start ≤ end); the reference defines the answer on valid offsets only.
"""
