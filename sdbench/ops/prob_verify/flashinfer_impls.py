"""prob_verify's FlashInfer peer: the chain speculative sampling kernel, from the flashinfer package or,
failing that, JIT-built from its header (flashinfer/sampling.cuh) in a folder the user points to with
SDBENCH_FLASHINFER_INCLUDE (flashinfer_jit/chain.cu, built with torch.utils.cpp_extension.load).

Two entries, so a peer is timed through the call an engine makes and sdbench's own glue is a row of
its own:
- `flashinfer_chain`: the engine call. Float32 probabilities and int32 draft ids are prepared once
  (an engine keeps them so), the two int32 counters are reused and zeroed before every call (the
  kernel adds into them, `+=`, and an engine needs this step's counts to advance its sequences, so
  the two fills are part of the engine's step), and the Philox offset advances on the host per call
  (FlashInfer leaves advancing to the caller; a CUDA graph bakes the offset in, as FlashInfer
  documents for integer seeds). Outputs: FlashInfer's own, output_tokens int32 [B, γ+1] and
  accepted_lengths = the emitted counts, int32 [B].
- `flashinfer_chain+adapter`: the same call plus sdbench's conversions inside the timed call (ids to
  int32, probabilities to float32 where stored otherwise, outputs copied into sdbench's dtypes and
  next_tokens gathered): the outputs every sdbench implementation has, for the χ² exactness tests.

FlashInfer draws its own randomness (Philox inside the kernel), so both run in fast mode only and are
checked in distribution, never token for token. Neither checks token ids (no error_flags).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
from collections.abc import Callable
from pathlib import Path

import torch

from sdbench.errors import SdbenchError
from sdbench.ops.prob_verify.common import allocate_outputs, warm_up
from sdbench.ops.prob_verify.workload import ProbWorkload
from sdbench.registry import BufferedRun, Implementation, register

INCLUDE_ENV = "SDBENCH_FLASHINFER_INCLUDE"
JIT_SOURCE = Path(__file__).resolve().parent / "flashinfer_jit" / "chain.cu"
# torch's extension flags define these, which breaks the header's half / bfloat16 conversions.
JIT_CUDA_FLAGS = ["-O3", "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
                  "-U__CUDA_NO_BFLOAT16_CONVERSIONS__", "-U__CUDA_NO_HALF2_OPERATORS__"]

# chain(draft_probs f32 [B,γ,V], draft_ids i32 [B,γ], target_probs f32 [B,γ+1,V], accepted i32 [B],
#       emitted i32 [B], seed, offset) -> output_tokens i32 [B, γ+1]
Chain = Callable[..., torch.Tensor]


def _package_reason() -> str | None:
    if importlib.util.find_spec("flashinfer") is None:
        return "flashinfer is not installed (pip install flashinfer-python)"
    try:
        sampling = importlib.import_module("flashinfer.sampling")
    except Exception as err:  # a broken install is a reason, not a crash
        return f"flashinfer does not import: {type(err).__name__}: {err}"
    if not hasattr(sampling, "chain_speculative_sampling"):
        return "this flashinfer has no sampling.chain_speculative_sampling"
    return None


def _include_folder() -> Path | None:
    value = os.environ.get(INCLUDE_ENV)
    return Path(value).expanduser() if value else None


def _include_reason() -> str | None:
    folder = _include_folder()
    if folder is None:
        return f"{INCLUDE_ENV} is not set"
    if not (folder / "flashinfer" / "sampling.cuh").is_file():
        return f"{INCLUDE_ENV}={folder} holds no flashinfer/sampling.cuh (unzip flashinfer/data/include from the wheel)"
    return None


def flashinfer_source() -> str:
    """Which FlashInfer the peer uses, in one line (for `sdbench doctor`)."""
    package = _package_reason()
    if package is None:
        import flashinfer

        return f"flashinfer package {getattr(flashinfer, '__version__', '?')} ({Path(flashinfer.__file__).parent})"
    include = _include_reason()
    if include is None:
        return f"JIT build of flashinfer/sampling.cuh from {INCLUDE_ENV}={_include_folder()}"
    return f"none: {package}; {include}"


def _flashinfer_probe(device: torch.device) -> str | None:
    if not torch.cuda.is_available():
        return "needs a CUDA device"
    package, include = _package_reason(), _include_reason()
    if package is not None and include is not None:
        return f"{package}; or set {INCLUDE_ENV} to an unzipped flashinfer include folder ({include})"
    return None


def _package_chain() -> Chain:
    from flashinfer.sampling import chain_speculative_sampling

    params = inspect.signature(chain_speculative_sampling).parameters
    if "uniform_samples" in params:  # flashinfer <= 0.2: caller-drawn uniforms [B, γ+1]
        def legacy(draft, ids, target, accepted, emitted, seed, offset):
            batch, gamma = ids.shape
            gen = torch.Generator(device=draft.device).manual_seed(seed + offset)
            uniforms = torch.rand((batch, gamma + 1), generator=gen, device=draft.device)
            result = chain_speculative_sampling(draft, ids, uniforms, target, accepted, emitted)
            return result[0] if isinstance(result, tuple) else result
        return legacy
    seeded = "seed" in params and "offset" in params

    def chain(draft, ids, target, accepted, emitted, seed, offset):
        kwargs = {"seed": seed, "offset": offset} if seeded else {}
        result = chain_speculative_sampling(draft, ids, target, accepted, emitted, **kwargs)
        return result[0] if isinstance(result, tuple) else result
    return chain


_jit_module = None


def _jit_chain() -> Chain:
    """Build (once per process; torch caches the build on disk) and bind the header-only kernel."""
    global _jit_module
    if _jit_module is None:
        from torch.utils.cpp_extension import load

        _jit_module = load(name="sdbench_flashinfer_chain", sources=[str(JIT_SOURCE)],
                           extra_include_paths=[str(_include_folder())], extra_cuda_cflags=JIT_CUDA_FLAGS,
                           verbose=False)
    module = _jit_module

    def chain(draft, ids, target, accepted, emitted, seed, offset):
        batch, gamma = ids.shape
        tokens = torch.empty((batch, gamma + 1), dtype=torch.int32, device=ids.device)  # as flashinfer's own call
        module.chain_speculative_sampling(draft, ids, target, tokens, accepted, emitted, True, seed, offset)
        return tokens
    return chain


def _chain() -> Chain:
    return _package_chain() if _package_reason() is None else _jit_chain()


def _refuse_supplied(w: ProbWorkload) -> None:
    if w.randomness == "supplied":
        raise SdbenchError(
            "flashinfer_chain draws its own randomness (Philox inside the kernel) and takes no exponential "
            "noise, so it cannot reproduce supplied-randomness tokens; time it in fast mode "
            "(workload.with_randomness('fast')) and check it in distribution (the χ² exactness test)"
        )


def _float_probs(values: torch.Tensor, logprobs: bool) -> torch.Tensor:
    """FlashInfer takes float32 probabilities (a no-op for stored float32 probabilities)."""
    values = values if values.dtype == torch.float32 else values.float()
    return values.exp() if logprobs else values


def _counters(w: ProbWorkload) -> tuple[torch.Tensor, torch.Tensor]:
    batch = w.config.batch_size
    return (torch.zeros(batch, dtype=torch.int32, device=w.device), torch.zeros(batch, dtype=torch.int32, device=w.device))


def _prepare_engine_call(w: ProbWorkload):
    _refuse_supplied(w)
    chain = _chain()
    draft = _float_probs(w.draft_probs, w.config.logprobs).contiguous()  # an engine's probabilities: float32
    target = _float_probs(w.target_probs, w.config.logprobs).contiguous()
    draft_ids = w.draft_tokens.to(torch.int32).contiguous()  # an engine keeps its ids int32
    accepted_num, emitted_num = _counters(w)
    state = {"offset": w.offset}

    def run():
        accepted_num.zero_()  # the kernel adds into the counters: the step's counts need them zeroed
        emitted_num.zero_()
        tokens = chain(draft, draft_ids, target, accepted_num, emitted_num, w.seed, state["offset"])
        state["offset"] += 1  # the engine's per-step offset (host side: no device work)
        return {"output_tokens": tokens, "accepted_lengths": emitted_num}

    if w.device.type == "cuda":
        run()
        torch.cuda.synchronize(w.device)
    state["offset"] = w.offset
    return run


def _prepare_with_adapter(w: ProbWorkload):
    _refuse_supplied(w)
    chain = _chain()
    batch, gamma = w.draft_tokens.shape
    outputs = allocate_outputs(w, error_flags=False)  # FlashInfer checks no token ids
    accepted_num, emitted_num = _counters(w)
    logprobs = w.config.logprobs
    state = {"offset": w.offset}

    def launch():
        draft_ids = w.draft_tokens.to(torch.int32)  # sdbench's token dtype -> FlashInfer's int32
        target, draft = _float_probs(w.target_probs, logprobs), _float_probs(w.draft_probs, logprobs)
        accepted_num.zero_()
        emitted_num.zero_()
        tokens = chain(draft, draft_ids, target, accepted_num, emitted_num, w.seed, state["offset"])
        state["offset"] += 1
        outputs["output_tokens"].copy_(tokens)
        outputs["accepted_lengths"].copy_(emitted_num)
        outputs["next_tokens"].copy_(tokens.gather(1, emitted_num.long()[:, None]).squeeze(1))

    run = warm_up(BufferedRun(launch, outputs), w)
    state["offset"] = w.offset
    return run


register(Implementation(
    op="prob_verify", name="flashinfer_chain", backend="cuda", probe=_flashinfer_probe, peer=True, launches=3,
    launch_path="torch_eager",  # a pybind call that allocates and launches: closest to an eager ATen op
    description="FlashInfer chain_speculative_sampling as an engine calls it: int32 ids and float32 probs "
                "kept, counters zeroed and reused (its own Philox: fast randomness only)",
    prepare=_prepare_engine_call,
))
register(Implementation(
    op="prob_verify", name="flashinfer_chain+adapter", backend="cuda", probe=_flashinfer_probe, peer=True,
    launch_path="torch_eager",
    description="flashinfer_chain plus sdbench's conversions in the timed call (ids to int32, probs to "
                "float32, outputs to sdbench's dtypes, next_tokens gathered)",
    prepare=_prepare_with_adapter,
))
