"""verify in Triton: `serial_triton`, the verify design production engines ship in Triton today."""

from __future__ import annotations

import torch

from sdbench.ops.backends import triton_probe
from sdbench.ops.workload import VerifyWorkload
from sdbench.registry import BufferedRun, Implementation, register

try:
    import triton
    import triton.language as tl
except ImportError:  # triton is optional: triton_probe says why this cannot run
    triton = None

if triton is not None:

    @triton.jit
    def _serial_verify_kernel(
        draft_ptr, target_ptr, accepted_lengths_ptr, has_mismatch_ptr, next_tokens_ptr, output_tokens_ptr,
        gamma, draft_stride, target_stride, output_stride,
        ROW_BLOCK: tl.constexpr,
    ):
        """Grid (B,): one program per sequence; 1 warp, every lane runs the same scalar scan.

        The scan reads draft and target one position at a time and stops at the first mismatch, so
        it does k_i + 1 dependent load pairs (the latency the warp-ballot kernel avoids); each
        accepted draft token is written to the output row as it is found. Then one vector store
        fills the row's tail (positions > k_i) with -1. Registers: a handful of scalars plus the
        ROW_BLOCK-wide tail store; no shared memory.
        """
        sequence = tl.program_id(0).to(tl.int64)
        draft_row = draft_ptr + sequence * draft_stride
        target_row = target_ptr + sequence * target_stride
        output_row = output_tokens_ptr + sequence * output_stride

        position = 0
        rejected = 0
        while (position < gamma) & (rejected == 0):
            draft_token = tl.load(draft_row + position)
            if draft_token == tl.load(target_row + position):
                tl.store(output_row + position, draft_token)
                position += 1
            else:
                rejected = 1
        # The target's token at the first mismatch, or the bonus token when all γ were accepted.
        next_token = tl.load(target_row + position)
        tl.store(output_row + position, next_token)
        tail = tl.arange(0, ROW_BLOCK)
        tl.store(
            output_row + tail,
            tl.full([ROW_BLOCK], -1, output_tokens_ptr.dtype.element_ty),
            mask=(tail > position) & (tail <= gamma),
        )
        tl.store(accepted_lengths_ptr + sequence, position.to(tl.int64))
        tl.store(has_mismatch_ptr + sequence, (position < gamma).to(tl.uint8))
        tl.store(next_tokens_ptr + sequence, next_token)


def _prepare_serial_verify(w: VerifyWorkload) -> BufferedRun:
    batch, gamma = w.draft_tokens.shape
    device, token_dtype = w.draft_tokens.device, w.draft_tokens.dtype
    draft, target = w.draft_tokens.contiguous(), w.target_tokens.contiguous()
    outputs = {
        "accepted_lengths": torch.empty(batch, dtype=torch.int64, device=device),
        "has_mismatch": torch.empty(batch, dtype=torch.bool, device=device),
        "next_tokens": torch.empty(batch, dtype=token_dtype, device=device),
        # accepted drafts, then the next token, then -1: the row a serving engine appends.
        "output_tokens": torch.empty((batch, gamma + 1), dtype=token_dtype, device=device),
    }
    has_mismatch_bytes = outputs["has_mismatch"].view(torch.uint8)
    row_block = triton.next_power_of_2(gamma + 1)

    def launch() -> None:
        _serial_verify_kernel[(batch,)](
            draft, target, outputs["accepted_lengths"], has_mismatch_bytes, outputs["next_tokens"],
            outputs["output_tokens"], gamma, draft.stride(0), target.stride(0), outputs["output_tokens"].stride(0),
            ROW_BLOCK=row_block, num_warps=1,
        )

    return BufferedRun(launch, outputs)


register(Implementation(
    op="verify", name="serial_triton", backend="triton", devices=("cuda", "cpu"), peer=True, launches=1,
    description="Triton, one program per sequence: serial scan to the first mismatch, -1-filled output row",
    prepare=_prepare_serial_verify, probe=triton_probe,
))
