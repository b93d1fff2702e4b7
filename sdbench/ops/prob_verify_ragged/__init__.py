"""prob_verify over ragged draft lengths γ_i, in the flattened layout serving engines use.

Inputs (B requests, T = Σ γ_i draft tokens, V the vocabulary):
    draft_tokens         [T]          request i's drafts at [cu[i-1], cu[i])                (cu[-1] := 0)
    draft_probs  q       [T, V]       laid out like the drafts
    target_probs p       [T + B, V]   request i's γ_i + 1 rows at [cu[i-1] + i, cu[i] + i + 1) (the last one
                                      is its bonus row): verify_ragged's target layout
    cu_num_draft_tokens  [B]          int64, inclusive prefix sum of γ_i (vLLM's `cu_num_draft_tokens`)
    uniforms             [T]          float32, laid out like the drafts  } supplied randomness only, as in
    exponential_noise    [B, V]       float32, one race row per request  } prob_verify
Outputs, as prob_verify's per request: accepted_lengths int64 [B] (0 ≤ k_i ≤ γ_i), next_tokens [B],
output_tokens [T + B] laid out like the targets (request i's accepted drafts, its next token at slot k_i,
then -1 up to its γ_i + 1 slots), error_flags int32 [B] (a draft token outside [0, V):
sdbench.ops.input_contract). γ_i = 0 is allowed: k_i = 0 and the next token is the bonus draw from the
request's one target row.

Bad offsets (cu decreasing, negative, or past T) never read or write out of bounds: every kernel clamps
each request's range to [0, T] (start ≤ end), as verify_ragged's do; the reference defines the answer on
valid offsets only.
"""
