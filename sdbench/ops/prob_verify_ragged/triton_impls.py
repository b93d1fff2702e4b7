"""prob_verify_ragged in Triton: the one-launch `fused` sampler (sdbench's) and the `serial_sampler` peer
(vLLM's design for the flattened layout). Kernels in sdbench.ops.prob_verify_ragged.triton_kernels.

Randomness as prob_verify's Triton entries: supplied (uniforms [T], exponential_noise [B, V]: parity); fast,
`fused` draws in-kernel Philox from (seed, offset) with a device-side offset counter per request, advanced
by one per call, so timed calls and graph replays draw fresh numbers without a host sync; `serial_sampler`
draws PyTorch uniforms and noise before its kernels, as vLLM V1 does. Imported lazily (in prepare), like
prob_verify's kernels, and probed with them.
"""

from __future__ import annotations

import importlib

import torch

from sdbench.ops.backends import ANY_DEVICE
from sdbench.ops.prob_verify.common import draw_torch_randomness, warm_up
from sdbench.ops.prob_verify.triton_impls import _from_offset, _triton_probe
from sdbench.ops.prob_verify_ragged.workload import RaggedProbWorkload, ragged_prob_outputs
from sdbench.registry import BufferedRun, Implementation, register


def _triton():
    return importlib.import_module("sdbench.ops.prob_verify_ragged.triton_kernels")


def _inputs(w: RaggedProbWorkload, uniforms: torch.Tensor | None = None, noise: torch.Tensor | None = None):
    inputs = _triton().RaggedProbTensors(
        draft_tokens=w.draft_tokens, target_probs=w.target_probs, draft_probs=w.draft_probs,
        cu_num_draft_tokens=w.cu_num_draft_tokens, uniforms=w.uniforms if uniforms is None else uniforms,
        exponential_noise=w.exponential_noise if noise is None else noise, logprobs=w.config.logprobs,
        gamma_max=w.config.gamma,
    )
    inputs.check()
    return inputs


def _prepare_fused(w: RaggedProbWorkload) -> BufferedRun:
    from sdbench.ops.prob_verify import triton_kernels as prob_triton

    outputs = ragged_prob_outputs(w)
    batch = w.cu_num_draft_tokens.shape[0]
    best = torch.zeros(batch, dtype=torch.int64, device=w.device)  # per-request race slot
    arrivals = torch.zeros(batch, dtype=torch.int32, device=w.device)  # programs done per request
    plan = prob_triton.default_fused_plan(batch, w.config.vocab_size, w.device)
    offsets = prob_triton.philox_offsets(batch, w.offset, w.device)  # advanced on the device, call by call
    launch = _triton().fused_ragged_launcher(_inputs(w), outputs, best, arrivals, plan, w.randomness == "fast", w.seed,
                                             offsets)
    return _from_offset(warm_up(BufferedRun(launch, outputs), w), offsets, w)


def _prepare_serial(w: RaggedProbWorkload) -> BufferedRun:
    outputs = ragged_prob_outputs(w, error_flags=False)
    recovered = torch.empty(w.target_probs.shape[0], dtype=torch.int64, device=w.device)
    if w.randomness == "supplied":
        launch = _triton().serial_ragged_launcher(_inputs(w), outputs, recovered)
    else:
        uniforms, noise = torch.empty_like(w.uniforms), torch.empty_like(w.exponential_noise)
        kernel_launch = _triton().serial_ragged_launcher(_inputs(w, uniforms, noise), outputs, recovered)

        def launch():
            draw_torch_randomness(uniforms, noise)
            kernel_launch()
    return warm_up(BufferedRun(launch, outputs), w)


register(Implementation(
    op="prob_verify_ragged", name="serial_sampler", backend="triton", devices=ANY_DEVICE, probe=_triton_probe,
    peer=True, launches=2, prepare=_prepare_serial,
    description="vLLM's flattened-layout design: recovered token at every position of every request, then one "
                "program per request scanning its drafts",
))
register(Implementation(
    op="prob_verify_ragged", name="fused", backend="triton", devices=ANY_DEVICE, probe=_triton_probe, launches=1,
    launch_path="triton_bound", prepare=_prepare_fused,
    description="one launch: per-request scan from cu_num_draft_tokens, split single-pass race at the stopping row, "
                "atomic combine",
))
