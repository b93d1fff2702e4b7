"""What every prob_verify implementation shares: output buffers, torch-drawn randomness, warm-up."""

from __future__ import annotations

import torch

from sdbench.ops.prob_verify.workload import ProbWorkload
from sdbench.registry import BufferedRun

TINY = torch.finfo(torch.float32).tiny


def allocate_outputs(w: ProbWorkload, error_flags: bool = True) -> dict[str, torch.Tensor]:
    """The output buffers; error_flags (int32 [B], sdbench.ops.input_contract) for sdbench's kernels,
    not for peers that do not check their input."""
    batch, gamma = w.draft_tokens.shape
    outputs = {
        "accepted_lengths": torch.empty(batch, dtype=torch.int64, device=w.device),
        "next_tokens": torch.empty(batch, dtype=w.draft_tokens.dtype, device=w.device),
        "output_tokens": torch.empty((batch, gamma + 1), dtype=w.draft_tokens.dtype, device=w.device),
    }
    if error_flags:
        outputs["error_flags"] = torch.empty(batch, dtype=torch.int32, device=w.device)
    return outputs


def draw_torch_randomness(uniforms: torch.Tensor, noise: torch.Tensor) -> None:
    """Fresh uniforms and Exp(1) noise from PyTorch's default generator, in place (graph-safe)."""
    uniforms.uniform_()
    noise.exponential_().clamp_min_(TINY)


def warm_up(run: BufferedRun, w: ProbWorkload) -> BufferedRun:
    """Compile (and autotune) now, so a first timed, graph-captured or sync-checked call only launches."""
    if w.device.type == "cuda":
        run()
        torch.cuda.synchronize(w.device)
    return run
