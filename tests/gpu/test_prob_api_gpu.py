"""sdbench.prob_verify on the GPU: supplied randomness equals the reference, and after the binding's first
call the API neither syncs nor refuses CUDA-graph capture (written this session; first GPU run pending)."""

from __future__ import annotations

import torch

import sdbench
from sdbench.ops.prob_verify import reference
from sdbench.ops.prob_verify.workload import make_prob_workload
from sdbench.ops.workload import VerifyConfig


def test_supplied_equals_reference_and_later_calls_are_sync_free_and_capturable():
    w = make_prob_workload(VerifyConfig(32, 8, vocab_size=32000, seed=5), "cuda")
    args = (w.draft_tokens, w.target_probs, w.draft_probs)
    out = sdbench.prob_verify(*args, uniforms=w.uniforms, exponential_noise=w.exponential_noise)  # binds: may sync
    expected = reference.prob_verify(*args, w.uniforms, w.exponential_noise)
    for name in ("accepted_lengths", "next_tokens", "output_tokens"):
        assert torch.equal(out[name], expected[name]), name
    sdbench.prob_verify(*args, seed=1)  # binds the fast mode
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        sdbench.prob_verify(*args, seed=1)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = sdbench.prob_verify(*args, seed=1)
    graph.replay()
    torch.cuda.synchronize()
    k = captured["accepted_lengths"]
    assert bool(((k >= 0) & (k <= 8)).all())
