"""verify_pack_ragged on the GPU: every implementation bit-exact against the reference over ragged grids
(γ_i = 0, mixed 1..γ_max, all accepted, all rejected, large B, KV widths not a multiple of the copy
block), the Triton pipeline sync-free under sync-debug "error" and replayed in a CUDA graph on fresh
inputs."""

from __future__ import annotations

import itertools

import pytest
import torch

from sdbench import parity, registry
from sdbench.measure import timing
from sdbench.ops.verify_pack_ragged.reference import verify_pack_ragged
from sdbench.ops.verify_ragged.workload import make_ragged_workload
from sdbench.ops.workload import VerifyConfig

OP = "verify_pack_ragged"
IMPLS = ("torch_eager", "block_triton+pack_triton")


def _cases():
    grid = itertools.product((1, 5, 33, 1000), (1, 7, 33, 100), (0.3, 0.9), (8, 300, 2048))
    cases = [(VerifyConfig(b, g, a, kv_dim=kv, dist=("binomial", "geometric")[i % 2],
                           token_dtype=("int64", "int32")[i % 2], kv_dtype=("float16", "bfloat16")[i % 2],
                           seed=i), None) for i, (b, g, a, kv) in enumerate(grid)]
    cases += [
        (VerifyConfig(70000, 8, 0.7, kv_dim=64), None),
        (VerifyConfig(64, 16, 1.0, kv_dim=128), None),  # every kept draft accepted
        (VerifyConfig(64, 16, 0.0, kv_dim=128), None),  # every request rejects at once: nothing to pack
        (VerifyConfig(32, 9, 0.5, kv_dim=128), [0] * 32),  # no request has a draft
        (VerifyConfig(4, 1024, 1.0, kv_dim=128), [1024, 0, 1, 1023]),
    ]
    return cases


def _id(case) -> str:
    cfg, lengths = case
    return f"b{cfg.batch_size}-g{cfg.gamma}-a{cfg.alpha}-kv{cfg.kv_dim}" + ("-given" if lengths else "")


@pytest.mark.parametrize("case", _cases(), ids=_id)
def test_parity(case):
    cfg, lengths = case
    w = make_ragged_workload(cfg, "cuda", None if lengths is None else torch.tensor(lengths))
    failures = {name: parity.check(registry.get(OP, name), w) for name in IMPLS}
    assert {name: f for name, f in failures.items() if f is not None} == {}


def test_sync_free_and_graph_replay():
    cfg = VerifyConfig(300, 12, 0.7, kv_dim=256)
    w = make_ragged_workload(cfg, "cuda")
    other = make_ragged_workload(cfg.replace(seed=5), "cuda", w.draft_lengths)  # same γ_i, new tokens and KV
    run = registry.get(OP, "block_triton+pack_triton").prepare(w)
    run()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        outputs = run()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert parity.compare(parity.expected_outputs(OP, w), outputs) is None
    graph, _ = timing.capture_graph(run)
    for source in (other, w, other):
        w.draft_tokens.copy_(source.draft_tokens)
        w.target_tokens.copy_(source.target_tokens)
        w.draft_kv.copy_(source.draft_kv)
        parity.poison(run.outputs)
        graph.replay()
        torch.cuda.synchronize()
        expected = verify_pack_ragged(source.draft_tokens, source.target_tokens, source.cu_num_draft_tokens,
                                      source.draft_kv)
        assert parity.compare(expected, run.outputs) is None
