"""prob_verify in Triton: the one-launch `fused` sampler, the three-launch `flashspec` seed design, and
the `serial_sampler` peer (vLLM V1's random path). Kernels in sdbench.ops.prob_verify.triton_kernels.

Supplied randomness: every entry reads `uniforms` and `exponential_noise` and must equal the reference
token for token (parity). Fast: `fused` and `flashspec` draw Philox randomness in-kernel from (seed,
offset); the offset lives in a device counter (int64 [B]) that starts at workload.offset at prepare and
that the kernels advance by one per call, so every timed call and every CUDA-graph replay draws fresh
numbers with no host sync (the same seed and starting offset reproduce the same sequence of calls).
`serial_sampler` draws PyTorch uniforms and noise before its kernels, as vLLM V1 does.

Every entry writes error_flags (sdbench.ops.input_contract): a draft token outside [0, V) is read
as p = q = 0 and flagged, never loaded.

Triton kernels are imported lazily (in prepare), so this module registers its entries on machines
without Triton, and the interpreter mode is whatever TRITON_INTERPRET said before the first prepare.
"""

from __future__ import annotations

import importlib
import sys

import torch

from sdbench.ops.backends import ANY_DEVICE, TRITON_INTERPRETED, triton_probe
from sdbench.ops.prob_verify.common import allocate_outputs, draw_torch_randomness, warm_up
from sdbench.ops.prob_verify.workload import ProbWorkload
from sdbench.registry import BufferedRun, Implementation, register

_TRITON_MODULE = "sdbench.ops.prob_verify.triton_kernels"


def _triton():
    return importlib.import_module(_TRITON_MODULE)


def _triton_probe(device: torch.device) -> str | None:
    """backends.triton_probe, plus: the prob kernels were decorated under the same TRITON_INTERPRET as
    the rest (they are imported lazily, at the first prepare)."""
    reason = triton_probe(device)
    if reason is not None:
        return reason
    loaded = sys.modules.get(_TRITON_MODULE)
    if loaded is not None and loaded.INTERPRETED != TRITON_INTERPRETED:
        return "TRITON_INTERPRET changed after the Triton kernels were loaded; restart Python"
    return None


def _inputs(w: ProbWorkload, uniforms: torch.Tensor | None = None, noise: torch.Tensor | None = None):
    return _triton().ProbTensors(
        draft_tokens=w.draft_tokens, target_probs=w.target_probs, draft_probs=w.draft_probs,
        uniforms=w.uniforms if uniforms is None else uniforms,
        exponential_noise=w.exponential_noise if noise is None else noise,
        logprobs=w.config.logprobs,
    )


def _from_offset(run: BufferedRun, offsets: torch.Tensor, w: ProbWorkload) -> BufferedRun:
    """Rewind the offset counters the warm-up advanced, so a prepared run's first call draws at
    workload.offset on every device; `run.philox_offsets` exposes them (tests read them)."""
    offsets.fill_(w.offset)
    run.philox_offsets = offsets
    return run


def _prepare_fused(w: ProbWorkload):
    kernels = _triton()
    outputs = allocate_outputs(w)
    batch = w.config.batch_size
    best = torch.zeros(batch, dtype=torch.int64, device=w.device)  # per-sequence race slot
    arrivals = torch.zeros(batch, dtype=torch.int32, device=w.device)  # programs done per sequence
    plan = kernels.default_fused_plan(batch, w.config.vocab_size, w.device)
    inputs = _inputs(w)
    inputs.check()
    offsets = kernels.philox_offsets(batch, w.offset, w.device)  # advanced on the device, call by call
    launch = kernels.fused_launcher(inputs, outputs, best, arrivals, plan, w.randomness == "fast", w.seed, offsets)
    return _from_offset(warm_up(BufferedRun(launch, outputs), w), offsets, w)


def _prepare_flashspec(w: ProbWorkload):
    kernels = _triton()
    outputs = allocate_outputs(w)
    batch, gamma = w.draft_tokens.shape
    outputs["accept_probs"] = torch.empty((batch, gamma), dtype=torch.float32, device=w.device)
    accepted = torch.empty((batch, gamma), dtype=torch.int8, device=w.device)
    inputs = _inputs(w)
    inputs.check()
    offsets = kernels.philox_offsets(batch, w.offset, w.device)  # advanced on the device, call by call
    launch = kernels.flashspec_launcher(inputs, outputs, accepted, w.randomness == "fast", w.seed, offsets)
    return _from_offset(warm_up(BufferedRun(launch, outputs), w), offsets, w)


def _prepare_serial(w: ProbWorkload):
    kernels = _triton()
    outputs = allocate_outputs(w)
    batch, gamma = w.draft_tokens.shape
    recovered = torch.empty((batch, gamma + 1), dtype=torch.int64, device=w.device)
    if w.randomness == "supplied":
        inputs = _inputs(w)
        inputs.check()
        launch = kernels.serial_launcher(inputs, outputs, recovered)
    else:
        uniforms, noise = torch.empty_like(w.uniforms), torch.empty_like(w.exponential_noise)
        inputs = _inputs(w, uniforms, noise)
        inputs.check()
        kernel_launch = kernels.serial_launcher(inputs, outputs, recovered)

        def launch():
            draw_torch_randomness(uniforms, noise)
            kernel_launch()
    return warm_up(BufferedRun(launch, outputs), w)


register(Implementation(
    op="prob_verify", name="flashspec", backend="triton", devices=ANY_DEVICE, probe=_triton_probe, launches=3,
    description="Triton seed design: scalar verify grid (B/BLOCK_B, γ) + flat gather + one-block-per-row sample",
    prepare=_prepare_flashspec,
))
register(Implementation(
    op="prob_verify", name="serial_sampler", backend="triton", devices=ANY_DEVICE, probe=_triton_probe, peer=True,
    launches=2,
    description="vLLM V1 random-path design: recovered token over all V for every position, then a serial scan",
    prepare=_prepare_serial,
))
register(Implementation(
    op="prob_verify", name="fused", backend="triton", devices=ANY_DEVICE, probe=_triton_probe, launches=1,
    launch_path="triton_bound",
    description="one launch: scan, first rejection, split single-pass race over V at that row, 64-bit atomic combine",
    prepare=_prepare_fused,
))
