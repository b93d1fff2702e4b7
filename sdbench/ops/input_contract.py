"""What every implementation does with bad input: reads nothing out of bounds, gives the one answer the
reference defines, and reports the bad input in a device-side flag instead of syncing to raise.

Outputs named `error_flags` (int32 [B], one word per sequence, 0 = the sequence's input was valid)
carry the bits below. Kernels write every word on every call (parity poisons them), so a flag is
never stale. Nothing on the hot path reads them: a caller that wants an exception calls
`check_error_flags(outputs)` at its own next sync point (it syncs: it reads the flags to the host).

- prob_verify: TOKEN_OUT_OF_RANGE where a draft token is outside [0, V). Such a token has p = q = 0
  by definition: it is rejected at its position (so it never reaches output_tokens), its accept_prob
  is 0, and the next token is drawn at the first rejection as usual. Under the block rule (prob_verify's
  and prob_verify_logits' rule="block") its weight is 0 from that position on, so the block stops before it.
- pack: LENGTH_OUT_OF_RANGE where an accepted length is outside [0, γ]. The length is clamped to
  [0, γ] for the offsets and the copy alike.
"""

from __future__ import annotations

import torch

from sdbench.errors import SdbenchError

ERROR_FLAGS = "error_flags"
TOKEN_OUT_OF_RANGE = 1
LENGTH_OUT_OF_RANGE = 2
_MEANING = {TOKEN_OUT_OF_RANGE: "a draft token outside [0, V)", LENGTH_OUT_OF_RANGE: "an accepted length outside [0, γ]"}


def describe_error_flags(error_flags: torch.Tensor) -> str | None:
    """None when every flag is 0; else one line naming the first bad sequences and why (syncs)."""
    flags = error_flags.detach().cpu()
    bad = torch.nonzero(flags).flatten().tolist()
    if not bad:
        return None
    reasons = [meaning for bit, meaning in _MEANING.items() if bool((flags & bit).any())]
    shown = ", ".join(str(index) for index in bad[:8]) + (", …" if len(bad) > 8 else "")
    return f"bad input in {len(bad)} sequence(s) ({shown}): {'; '.join(reasons) or f'flags {flags[bad[0]].item()}'}"


def check_error_flags(outputs: dict[str, torch.Tensor]) -> None:
    """Raise SdbenchError when outputs' error_flags report bad input; outputs without flags pass.

    Reads the flags to the host, so call it where you sync anyway (it is never called on a hot path)."""
    flags = outputs.get(ERROR_FLAGS)
    if flags is None:
        return
    problem = describe_error_flags(flags)
    if problem is not None:
        raise SdbenchError(f"{problem}; the outputs follow the input contract (docs/perf-notes.md, 'Input contract')")
