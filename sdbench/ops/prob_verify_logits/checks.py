"""Parity for prob_verify_logits: sdbench.parity's poison and bit-exact compare against this op's
reference (sdbench.parity.expected_outputs dispatches by op name and knows the probability ops only)."""

from __future__ import annotations

from sdbench.ops.prob_verify_logits.reference import reference_outputs
from sdbench.ops.prob_verify_logits.workload import LogitsWorkload
from sdbench.registry import Implementation


def check(impl: Implementation, workload: LogitsWorkload) -> str | None:
    """Run impl once on workload (outputs poisoned first) and compare tokens and lengths bit for bit
    with the float32 reference of the workload's rule; None when they agree."""
    from sdbench import parity

    run = impl.prepare(workload)
    buffers = getattr(run, "outputs", None)
    if buffers is not None:
        parity.poison(buffers)
    actual = run()
    from sdbench.ops.input_contract import ERROR_FLAGS

    # peers (FlashInfer, vLLM's design) check no token ids: their error_flags may be absent, as in parity.check
    return parity.compare(reference_outputs(workload), actual, optional=(ERROR_FLAGS,) if impl.peer else ())
