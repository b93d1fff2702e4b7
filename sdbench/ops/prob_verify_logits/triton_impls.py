"""prob_verify_logits in Triton: sdbench's two-launch `fused_logits` (both rules: token and block), the
`vllm_v2_style` multi-kernel peer, and `softmax_fused_prob` (the softmax a caller runs, then sdbench's
probability `fused`); the peers run the token rule only.
Kernels in sdbench.ops.prob_verify_logits.triton_kernels, imported lazily (in prepare)."""

from __future__ import annotations

import importlib

import torch

from sdbench import registry
from sdbench.ops.backends import ANY_DEVICE
from sdbench.ops.prob_verify.triton_impls import _from_offset
from sdbench.ops.prob_verify.workload import ProbWorkload
from sdbench.ops.prob_verify_logits.common import SoftmaxBuffers, allocate_outputs, token_rule_only, warm_up
from sdbench.ops.prob_verify_logits.workload import LogitsWorkload
from sdbench.ops.workload import VerifyConfig
from sdbench.registry import BufferedRun, Implementation, register

_TRITON_MODULE = "sdbench.ops.prob_verify_logits.triton_kernels"


def _triton():
    return importlib.import_module(_TRITON_MODULE)


def _triton_probe(device: torch.device) -> str | None:
    from sdbench.ops.prob_verify.triton_impls import _triton_probe as prob_probe  # same interpreter rules

    return prob_probe(device)


def _inputs(w: LogitsWorkload):
    tensors = _triton().LogitsTensors(
        draft_tokens=w.draft_tokens, target_logits=w.target_logits, draft_logits=w.draft_logits,
        target_temperature=w.target_temperature, draft_temperature=w.draft_temperature,
        uniforms=w.uniforms, exponential_noise=w.exponential_noise,
    )
    tensors.check()
    return tensors


def _prepare_fused_logits(w: LogitsWorkload):
    outputs = allocate_outputs(w)
    launch = _triton().fused_logits_launcher(_inputs(w), outputs, w.randomness == "fast", w.seed, w.offset,
                                             rule=w.config.rule)
    return _from_offset(warm_up(BufferedRun(launch, outputs), w), launch.philox_offsets, w)


def _prepare_vllm_v2_style(w: LogitsWorkload):
    outputs = allocate_outputs(w, error_flags=False)  # a peer's design: vLLM checks no token ids
    launch = _triton().vllm_v2_style_launcher(_inputs(w), outputs, w.randomness == "fast", w.seed, w.offset)
    return _from_offset(warm_up(BufferedRun(launch, outputs), w), launch.philox_offsets, w)



def prob_workload_over(w: LogitsWorkload, buffers: SoftmaxBuffers) -> ProbWorkload:
    """A ProbWorkload whose p and q are the softmax buffers (filled before each call)."""
    cfg = w.config
    prob_cfg = VerifyConfig(cfg.batch_size, cfg.gamma, vocab_size=cfg.vocab_size, token_dtype=cfg.token_dtype,
                            seed=cfg.seed)
    return ProbWorkload(config=prob_cfg, draft_tokens=w.draft_tokens, target_probs=buffers.target_probs,
                        draft_probs=buffers.draft_probs, uniforms=w.uniforms, exponential_noise=w.exponential_noise,
                        realised_acceptance=float("nan"), randomness=w.randomness, offset=w.offset)


def _prepare_softmax_fused_prob(w: LogitsWorkload):
    buffers = SoftmaxBuffers(w.target_logits, w.draft_logits)
    logits = (w.target_logits, w.draft_logits, w.target_temperature, w.draft_temperature)
    buffers.fill(*logits)
    sampler = registry.get("prob_verify", "fused").prepare(prob_workload_over(w, buffers))

    def launch():
        buffers.fill(*logits)
        sampler.launch()

    return warm_up(BufferedRun(launch, sampler.outputs), w)


register(Implementation(
    op="prob_verify_logits", name="fused_logits", backend="triton", devices=ANY_DEVICE, probe=_triton_probe,
    launch_path="triton_bound",
    launches=2,  # the token rule; the block rule adds its residual-mass pass (3 when γ > 1)
    description="sdbench: one stream over the logits (row max/Σexp partials; rule=token skips greedy requests' draft "
                "rows), then scan + split race at row k (rule=block: a second stream for the residual masses r_i "
                "between them)",
    prepare=_prepare_fused_logits,
))
register(Implementation(
    op="prob_verify_logits", name="vllm_v2_style", backend="triton", devices=ANY_DEVICE, probe=_triton_probe,
    launch_path="triton_bound",
    supports=token_rule_only, peer=True, launches=4,
    description="vLLM model runner v2 design, re-implemented: block stats, accept scan, Gumbel resample, finish",
    prepare=_prepare_vllm_v2_style,
))
register(Implementation(
    op="prob_verify_logits", name="softmax_fused_prob", backend="triton", devices=ANY_DEVICE, probe=_triton_probe,
    launch_path="torch_eager",
    supports=token_rule_only, peer=True,
    description="torch temperature softmax into float32 p, q buffers, then sdbench's probability `fused`",
    prepare=_prepare_softmax_fused_prob,
))
