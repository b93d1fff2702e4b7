"""prob_verify_logits' FlashInfer peer: the temperature softmax into float32 buffers, then
`flashinfer.sampling.chain_speculative_sampling` (FlashInfer takes probabilities). Fast randomness
only (FlashInfer draws its own Philox), checked in distribution."""

from __future__ import annotations

from sdbench.ops.prob_verify.flashinfer_impls import _flashinfer_probe
from sdbench.ops.prob_verify_logits.common import SoftmaxBuffers, token_rule_only
from sdbench.ops.prob_verify_logits.workload import LogitsWorkload
from sdbench.registry import Implementation, register


def _prepare_softmax_flashinfer(w: LogitsWorkload):
    from sdbench import registry
    from sdbench.ops.prob_verify_logits.triton_impls import prob_workload_over

    buffers = SoftmaxBuffers(w.target_logits, w.draft_logits)
    logits = (w.target_logits, w.draft_logits, w.target_temperature, w.draft_temperature)
    buffers.fill(*logits)
    # the prob_verify entry owns FlashInfer's call as an engine makes it (int32 ids, float32 probabilities,
    # counters zeroed and reused; its outputs in FlashInfer's layout); it refuses supplied randomness
    sampler = registry.get("prob_verify", "flashinfer_chain").prepare(prob_workload_over(w, buffers))

    def run():
        buffers.fill(*logits)
        return sampler()

    return run


register(Implementation(
    op="prob_verify_logits", name="softmax_flashinfer", backend="cuda", probe=_flashinfer_probe, peer=True,
    launch_path="torch_eager",
    supports=token_rule_only,
    description="torch temperature softmax into float32 p, q, then FlashInfer chain_speculative_sampling",
    prepare=_prepare_softmax_flashinfer,
))
