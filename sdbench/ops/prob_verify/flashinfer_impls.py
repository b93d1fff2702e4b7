"""prob_verify's FlashInfer peer: `flashinfer.sampling.chain_speculative_sampling` when flashinfer imports.

FlashInfer draws its own randomness (Philox inside the kernel), so it runs in fast mode only and is
checked in distribution (the χ² exactness tests), never token for token.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect

import torch

from sdbench.errors import SdbenchError
from sdbench.ops.prob_verify.common import allocate_outputs, warm_up
from sdbench.ops.prob_verify.workload import ProbWorkload
from sdbench.registry import BufferedRun, Implementation, register


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
    outputs = allocate_outputs(w, error_flags=False)  # FlashInfer checks no token ids
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

    return warm_up(BufferedRun(launch, outputs), w)


register(Implementation(
    op="prob_verify", name="flashinfer_chain", backend="cuda", probe=_flashinfer_probe, peer=True,
    description="FlashInfer sampling.chain_speculative_sampling (its own Philox: fast randomness only)",
    prepare=_prepare_flashinfer,
))
