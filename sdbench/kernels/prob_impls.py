"""prob_verify implementations: eager PyTorch, the Triton kernels, and FlashInfer when it imports.

Every entry honours the workload's randomness mode. Supplied: all read `uniforms` and
`exponential_noise` and must equal `reference.prob_verify` token for token (parity). Fast: the
Triton kernels `fused` and `flashspec` draw Philox randomness in-kernel from (seed, offset) — same
seed and offset, same tokens, and the two agree with each other; the peers draw the way their
designs do (torch_eager and serial_sampler: PyTorch's default generator into [B, γ] uniforms and
[B, V] noise before the verify, as vLLM V1 does; flashinfer_chain: its own Philox).

Triton is imported lazily (in prepare), so this module registers its entries on machines without
Triton, and the interpreter mode is whatever TRITON_INTERPRET said before the first prepare.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys

import torch

from sdbench import reference
from sdbench.errors import SdbenchError
from sdbench.registry import BufferedRun, Implementation, register
from sdbench.workload import ProbWorkload

_TRITON_MODULE = "sdbench.kernels.prob_triton"
_TINY = torch.finfo(torch.float32).tiny


def _triton():
    return importlib.import_module(_TRITON_MODULE)


def _allocate_outputs(w: ProbWorkload) -> dict[str, torch.Tensor]:
    batch, gamma = w.draft_tokens.shape
    return {
        "accepted_lengths": torch.empty(batch, dtype=torch.int64, device=w.device),
        "next_tokens": torch.empty(batch, dtype=w.draft_tokens.dtype, device=w.device),
        "output_tokens": torch.empty((batch, gamma + 1), dtype=w.draft_tokens.dtype, device=w.device),
    }


def _inputs(w: ProbWorkload, uniforms: torch.Tensor | None = None, noise: torch.Tensor | None = None):
    return _triton().ProbTensors(
        draft_tokens=w.draft_tokens, target_probs=w.target_probs, draft_probs=w.draft_probs,
        uniforms=w.uniforms if uniforms is None else uniforms,
        exponential_noise=w.exponential_noise if noise is None else noise,
        logprobs=w.config.logprobs,
    )


def _draw_torch_randomness(uniforms: torch.Tensor, noise: torch.Tensor) -> None:
    """Fresh uniforms and Exp(1) noise from PyTorch's default generator, in place (graph-safe)."""
    uniforms.uniform_()
    noise.exponential_().clamp_min_(_TINY)


def _warm_up(run: BufferedRun, w: ProbWorkload) -> BufferedRun:
    """Compile (and autotune) now, so a first timed, graph-captured or sync-checked call only launches."""
    if w.device.type == "cuda":
        run()
        torch.cuda.synchronize(w.device)
    return run


def _triton_probe(device: torch.device) -> str | None:
    """triton_impls' probe (installed, interpreter vs GPU), plus: the prob kernels were decorated
    under the same TRITON_INTERPRET as the rest."""
    from sdbench.kernels import triton_impls

    reason = triton_impls.unavailable_reason(device)
    if reason is not None:
        return reason
    loaded = sys.modules.get(_TRITON_MODULE)
    if loaded is not None and loaded.INTERPRETED != triton_impls.INTERPRETED:
        return "TRITON_INTERPRET changed after the Triton kernels were loaded; restart Python"
    return None


# --- torch_eager -------------------------------------------------------------------------------
def _prepare_torch_eager(w: ProbWorkload):
    logprobs = w.config.logprobs
    if w.randomness == "supplied":
        return lambda: reference.prob_verify(
            w.draft_tokens, w.target_probs, w.draft_probs, w.uniforms, w.exponential_noise, logprobs=logprobs
        )
    uniforms, noise = torch.empty_like(w.uniforms), torch.empty_like(w.exponential_noise)

    def run():
        _draw_torch_randomness(uniforms, noise)
        return reference.prob_verify(w.draft_tokens, w.target_probs, w.draft_probs, uniforms, noise, logprobs=logprobs)

    return run


# --- Triton ------------------------------------------------------------------------------------
def _prepare_fused(w: ProbWorkload):
    kernels = _triton()
    outputs = _allocate_outputs(w)
    batch = w.config.batch_size
    best = torch.zeros(batch, dtype=torch.int64, device=w.device)  # per-sequence race slot
    arrivals = torch.zeros(batch, dtype=torch.int32, device=w.device)  # programs done per sequence
    plan = kernels.default_fused_plan(batch, w.config.vocab_size, w.device)
    inputs = _inputs(w)
    inputs.check()
    launch = kernels.fused_launcher(inputs, outputs, best, arrivals, plan, w.randomness == "fast", w.seed, w.offset)
    return _warm_up(BufferedRun(launch, outputs), w)


def _prepare_flashspec(w: ProbWorkload):
    kernels = _triton()
    outputs = _allocate_outputs(w)
    batch, gamma = w.draft_tokens.shape
    outputs["accept_probs"] = torch.empty((batch, gamma), dtype=torch.float32, device=w.device)
    accepted = torch.empty((batch, gamma), dtype=torch.int8, device=w.device)
    inputs = _inputs(w)
    inputs.check()
    launch = kernels.flashspec_launcher(inputs, outputs, accepted, w.randomness == "fast", w.seed, w.offset)
    return _warm_up(BufferedRun(launch, outputs), w)


def _prepare_serial(w: ProbWorkload):
    kernels = _triton()
    outputs = _allocate_outputs(w)
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
            _draw_torch_randomness(uniforms, noise)
            kernel_launch()
    return _warm_up(BufferedRun(launch, outputs), w)


# --- FlashInfer --------------------------------------------------------------------------------
def _flashinfer_probe(device: torch.device) -> str | None:
    if not torch.cuda.is_available():
        return "needs a CUDA device"
    if importlib.util.find_spec("flashinfer") is None:
        return "flashinfer is not installed (pip install flashinfer-python)"
    try:
        sampling = importlib.import_module("flashinfer.sampling")
    except Exception as err:  # a broken install is a reason, not a crash
        return f"flashinfer does not import: {type(err).__name__}: {err}"
    if not hasattr(sampling, "chain_speculative_sampling"):
        return "this flashinfer has no sampling.chain_speculative_sampling"
    return None


def _prepare_flashinfer(w: ProbWorkload):
    if w.randomness == "supplied":
        raise SdbenchError(
            "flashinfer_chain draws its own randomness (Philox inside the kernel) and takes no exponential "
            "noise, so it cannot reproduce supplied-randomness tokens; time it in fast mode "
            "(workload.with_randomness('fast')) and check it in distribution (the χ² exactness test)"
        )
    from flashinfer.sampling import chain_speculative_sampling

    params = inspect.signature(chain_speculative_sampling).parameters
    batch, gamma = w.draft_tokens.shape
    outputs = _allocate_outputs(w)
    draft_ids = w.draft_tokens.to(torch.int32)  # FlashInfer's id type; a caller would keep them int32
    accepted_num = torch.zeros(batch, dtype=torch.int32, device=w.device)
    emitted_num = torch.zeros(batch, dtype=torch.int32, device=w.device)
    needs_conversion = w.config.logprobs or w.target_probs.dtype != torch.float32
    kwargs = {}
    if "seed" in params and "offset" in params:
        kwargs = {"seed": w.seed, "offset": w.offset}
    legacy_uniforms = None
    if "uniform_samples" in params:  # flashinfer <= 0.2: caller-drawn uniforms [B, γ+1]
        gen = torch.Generator(device=w.device).manual_seed(w.seed)
        legacy_uniforms = torch.rand((batch, gamma + 1), generator=gen, device=w.device)

    def launch():
        target, draft = w.target_probs, w.draft_probs
        if needs_conversion:  # FlashInfer takes float32 probabilities: the caller pays for converting
            target = target.float().exp() if w.config.logprobs else target.float()
            draft = draft.float().exp() if w.config.logprobs else draft.float()
        accepted_num.zero_()  # FlashInfer adds into these counters
        emitted_num.zero_()
        if legacy_uniforms is not None:
            result = chain_speculative_sampling(draft, draft_ids, legacy_uniforms, target, accepted_num, emitted_num)
        else:
            result = chain_speculative_sampling(draft, draft_ids, target, accepted_num, emitted_num, **kwargs)
        tokens = result[0] if isinstance(result, tuple) else result
        outputs["output_tokens"].copy_(tokens)
        outputs["accepted_lengths"].copy_(emitted_num)
        outputs["next_tokens"].copy_(tokens.gather(1, emitted_num.long()[:, None]).squeeze(1))

    return _warm_up(BufferedRun(launch, outputs), w)


_ANY_DEVICE = ("cpu", "cuda")

register(Implementation(
    op="prob_verify", name="torch_eager", backend="torch", devices=_ANY_DEVICE, peer=True,
    description="eager PyTorch: gather p, q at the drafts, cumprod of accepts, race at the stopping row",
    prepare=_prepare_torch_eager,
))
register(Implementation(
    op="prob_verify", name="flashspec", backend="triton", devices=_ANY_DEVICE, probe=_triton_probe, launches=3,
    description="Triton seed design: scalar verify grid (B/BLOCK_B, γ) + flat gather + one-block-per-row sample",
    prepare=_prepare_flashspec,
))
register(Implementation(
    op="prob_verify", name="serial_sampler", backend="triton", devices=_ANY_DEVICE, probe=_triton_probe, peer=True,
    launches=2,
    description="vLLM V1 random-path design: recovered token over all V for every position, then a serial scan",
    prepare=_prepare_serial,
))
register(Implementation(
    op="prob_verify", name="fused", backend="triton", devices=_ANY_DEVICE, probe=_triton_probe, launches=1,
    description="one launch: scan, first rejection, split single-pass race over V at that row, 64-bit atomic combine",
    prepare=_prepare_fused,
))
register(Implementation(
    op="prob_verify", name="flashinfer_chain", backend="cuda", probe=_flashinfer_probe, peer=True,
    description="FlashInfer sampling.chain_speculative_sampling (its own Philox: fast randomness only)",
    prepare=_prepare_flashinfer,
))
