"""verify-and-pack over ragged draft lengths γ_i, in the flattened layout serving engines use.

Inputs: those of verify_ragged (draft_tokens [T], target_tokens [T + B], cu_num_draft_tokens [B]) and
    draft_kv             [T, kv_dim]  request i's draft KV rows at [cu[i-1], cu[i]), like its drafts
Outputs: verify_ragged's (accepted_lengths, has_mismatch, next_tokens) and pack's:
    packed_kv            [N, kv_dim]  N >= Σ k_i: request i's first k_i rows at packed_offsets[i];
                                      rows past Σ k_i are unspecified
    packed_offsets       [B] int64    exclusive prefix sum of k_i
The workload is verify_ragged's with kv_dim > 0 (sdbench/ops/verify_ragged/workload.py).
Bad offsets never read or write out of bounds: kernels clamp every request's range to [0, T] and write no
packed row past the buffer (overlapping ranges can make Σ k_i exceed T; the outputs are then unspecified).
"""
