"""The operations sdbench verifies and times, one package each.

    ops/<op>/reference.py      the definition of correctness (eager PyTorch)
    ops/<op>/*_impls.py        every implementation, each registered where it is defined
    ops/workload.py            VerifyConfig (one point of any grid) and the greedy ops' inputs
    ops/prob_verify/workload.py  prob_verify's inputs
    ops/prob_verify_logits/workload.py  prob_verify_logits' inputs (LogitsConfig)
    ops/verify_ragged/workload.py  verify_ragged's and verify_pack_ragged's inputs (ragged γ_i, flattened layout)
    ops/prob_verify_ragged/workload.py  prob_verify_ragged's inputs (prob_verify's, cut to ragged γ_i)

The registry imports every `*_impls` module under this package, so adding an implementation is one
function and one `register(...)` call in its op's folder.
"""

from __future__ import annotations

import torch

OPERATIONS = ("verify", "pack", "verify_pack", "prob_verify", "prob_verify_logits", "verify_ragged",
              "verify_pack_ragged", "prob_verify_ragged")


def make_workload(op: str, cfg, device: str | torch.device = "cpu"):
    """The workload an operation runs on: greedy ops share VerifyWorkload; the others have their own."""
    if op == "prob_verify":
        from sdbench.ops.prob_verify.workload import make_prob_workload

        return make_prob_workload(cfg, device)
    if op == "prob_verify_logits":  # a LogitsConfig, or a VerifyConfig's batch, γ, V, prob_dtype, seed
        from sdbench.ops.prob_verify_logits.workload import make_logits_workload

        return make_logits_workload(cfg, device)
    if op == "prob_verify_ragged":
        from sdbench.ops.prob_verify_ragged.workload import make_ragged_prob_workload

        return make_ragged_prob_workload(cfg, device)
    if op in ("verify_ragged", "verify_pack_ragged"):
        from sdbench.ops.verify_ragged.workload import make_ragged_workload

        return make_ragged_workload(cfg, device)
    from sdbench.ops.workload import make_verify_workload

    return make_verify_workload(cfg, device)
