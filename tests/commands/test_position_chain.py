"""position_chain's probe kernel under the Triton interpreter (programs run in index order, so its waits never
spin): the rows it reads get the stats torch computes, the rows past a sequence's stop are never read (their stats
stay poisoned), and a second call (a new epoch) needs no reset."""

from __future__ import annotations

import pytest
from interpreted import run_interpreted

CASE = r"""
import json, torch
from sdbench.commands.position_chain import FRONTIER_STATES, STOPPED, PositionChain

torch.manual_seed(0)
batch, gamma = 3, 3
report = {}
# (vocab, splits): one tile a split; several tiles a split (span 2500 > TILE, so the running sum is rescaled);
# a split past the vocabulary (span 3: the fourth split of 9 columns is empty); bf16 logits (8 a lane, not 4)
for vocab, splits, dtype in ((1000, 3, torch.float32), (5000, 2, torch.float32), (9, 4, torch.float32),
                             (2000, 3, torch.bfloat16)):
    target = (torch.randn(batch, gamma + 1, vocab) * 4).to(dtype)
    draft = (torch.randn(batch, gamma, vocab) * 4).to(dtype)
    target[0, 1, : vocab // 2] = float("-inf")  # half a row masked out by its logits
    for name, stop, wait, read_first in (("chain-k", [0, 2, 3], True, False), ("parallel", [3, 3, 3], False, False),
                                         ("chain-all", [3, 3, 3], True, False),
                                         ("chain-k-read-first", [0, 2, 3], True, True)):
        probe = PositionChain(target, draft, torch.tensor(stop), splits, wait, read_first)
        for call in range(3):  # later calls: new epochs over the earlier ones' frontier and counts
            if call == 2:
                probe.epoch = 2**31 // FRONTIER_STATES - 2  # the last epoch before the wrap: this call's
            problem = probe.check()
            report[f"{vocab}/{name}/{call}"] = {
                "problem": problem,
                "arrivals_zero": bool((probe.arrivals == 0).all()),
                "frontier": probe.frontier.tolist(), "epoch": probe.epoch,
                "unread_rows": int((~probe.rows_read()).sum()),
            }
report["stopped"] = STOPPED
report["states"] = FRONTIER_STATES
print(json.dumps(report))
"""


def test_the_chain_reads_up_to_each_stop_and_gets_torchs_stats():
    report = run_interpreted(CASE)
    stopped, states = report.pop("stopped"), report.pop("states")
    modes = ("chain-k", "parallel", "chain-all", "chain-k-read-first")
    assert set(report) == {f"{vocab}/{mode}/{call}" for vocab in (1000, 5000, 9, 2000) for mode in modes
                           for call in range(3)}
    for case, verdict in report.items():
        assert verdict["problem"] is None and verdict["arrivals_zero"], (case, verdict)
        # every sequence's frontier ends "stopped" in this call's epoch (the wrap's call included)
        assert verdict["frontier"] == [verdict["epoch"] * states + stopped] * 3, (case, verdict)
    assert report["1000/chain-k/2"]["epoch"] == 2**31 // states - 1
    # stops at 0, 2, 3 of γ = 3: 5 + 1 + 0 of the 21 rows are never read
    assert report["1000/chain-k/0"]["unread_rows"] == 6 and report["1000/parallel/0"]["unread_rows"] == 0
    assert report["1000/chain-k-read-first/0"]["unread_rows"] == 6  # read, then dropped: no stats


@pytest.mark.parametrize("wait,read_first", [(True, False), (False, False), (True, True)])
def test_the_probe_compiles_for_sm90(wait, read_first):
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
             "frontier_ptr": "*i32", "abort_ptr": "*i32", "partial_ptr": "*fp32", "stats_ptr": "*fp32"}
    constexprs = {"GAMMA": 4, "TILE": position_chain.TILE, "VEC": 8, "FTZ_EXP2": True, "WAIT": wait,
                  "READ_FIRST": read_first,
                  "STATES": position_chain.FRONTIER_STATES,
                  "STOP": position_chain.STOPPED, "MAX_POLLS": position_chain.MAX_POLLS}
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
