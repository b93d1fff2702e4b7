"""position_chain's probe kernel under the Triton interpreter (programs run in index order, so its waits never
spin): the rows it reads get the stats torch computes, the rows past a sequence's stop are never read (their stats
stay poisoned), and a second call (a new epoch) needs no reset."""

from __future__ import annotations

import pytest
from interpreted import run_interpreted

CASE = r"""
import json, torch
from sdbench.commands.position_chain import PositionChain

torch.manual_seed(0)
batch, gamma, vocab, splits = 3, 3, 1000, 3
target = torch.randn(batch, gamma + 1, vocab) * 4
draft = torch.randn(batch, gamma, vocab) * 4
rows = torch.stack([target[:, 0], draft[:, 0], target[:, 1], draft[:, 1], target[:, 2], draft[:, 2], target[:, 3]], 1)
expected = torch.stack([rows.amax(-1), torch.exp(rows - rows.amax(-1, keepdim=True)).sum(-1)], -1)
report = {}
for name, stop, wait in (("chain-k", [0, 2, 3], True), ("parallel", [3, 3, 3], False), ("chain-all", [3, 3, 3], True)):
    probe = PositionChain(target, draft, torch.tensor(stop), splits, wait)
    for call in range(2):  # the second call: a new epoch over the first one's frontier and counts
        probe.stats.fill_(float("nan"))
        stats = probe.run()
        read = torch.zeros(batch, 2 * gamma + 1, dtype=torch.bool)
        for seq, k in enumerate(stop if wait else [gamma] * batch):
            read[seq, : 2 * k + 1 + (1 if k < gamma else 0)] = True  # target 0..k, draft 0..k (none at γ)
        report[f"{name}/{call}"] = {
            "read_match": bool(torch.allclose(stats[read], expected[read], rtol=1e-5, atol=1e-5)),
            "unread_poisoned": bool(torch.isnan(stats[~read]).all()),
            "arrivals_zero": bool((probe.arrivals == 0).all()),
            "unread_rows": int((~read).sum()),
        }
print(json.dumps(report))
"""


def test_the_chain_reads_up_to_each_stop_and_gets_torchs_stats():
    report = run_interpreted(CASE)
    assert set(report) == {f"{mode}/{call}" for mode in ("chain-k", "parallel", "chain-all") for call in (0, 1)}
    for case, verdict in report.items():
        assert verdict["read_match"] and verdict["unread_poisoned"] and verdict["arrivals_zero"], (case, verdict)
    # stops at 0, 2, 3 of γ = 3: 5 + 1 + 0 of the 21 rows are never read
    assert report["chain-k/0"]["unread_rows"] == 6 and report["parallel/0"]["unread_rows"] == 0


@pytest.mark.parametrize("wait", [True, False])
def test_the_probe_compiles_for_sm90(wait):
    """Offline, no GPU (as test_logits_compile): the compiler's checks the interpreter skips. The wait polls the
    frontier with acquire loads; the last arrival publishes it with a release exchange."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from sdbench.commands import position_chain
    from sdbench.ops.prob_verify.triton_kernels import INTERPRETED

    if INTERPRETED:
        pytest.skip("TRITON_INTERPRET=1 replaces the kernels with interpreted functions")
    fn = position_chain._position_chain_kernel
    types = {"target_ptr": "*bf16", "draft_ptr": "*bf16", "stop_at_ptr": "*i32", "arrivals_ptr": "*i32",
             "frontier_ptr": "*i32", "partial_ptr": "*fp32", "stats_ptr": "*fp32"}
    constexprs = {"GAMMA": 4, "TILE": position_chain.TILE, "WAIT": wait, "STATES": position_chain.FRONTIER_STATES,
                  "STOP": position_chain.STOPPED}
    signature = {name: "constexpr" if name in constexprs else types.get(name, "i32") for name in fn.arg_names}
    source = ASTSource(fn=fn, signature=signature,
                       constexprs={(fn.arg_names.index(name),): value for name, value in constexprs.items()})
    try:
        ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]
    except Exception as err:  # a missing toolchain is a skip; a compile error in the kernel is a failure
        if "ptxas" in str(err) and "error" not in str(err).lower():
            pytest.skip(f"Triton's CUDA toolchain is not usable here: {err}")
        raise
    assert ("ld.global.gpu.acquire" in ptx) == wait and "atom.global.gpu.release.exch" in ptx
