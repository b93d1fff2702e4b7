"""fused_logits' kernels compiled offline for sm_90 (Triton's CUDA backend, no GPU needed): the interpreter
runs a kernel's arithmetic but not the compiler's checks (a tensor must keep its shape and type across
branches, constexpr-only arguments), which a GPU run would be the first to see."""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

POINTERS_I32 = {"stats_arg_ptr", "row_arg_ptr", "arrivals_ptr"}


def _compile(fn, constexprs: dict, logits: str = "*bf16"):
    signature = {}
    for name in fn.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in ("target_ptr", "draft_ptr"):
            signature[name] = logits
        elif name.endswith("_ptr"):
            signature[name] = "*i32" if name in POINTERS_I32 else "*fp32"
        else:
            signature[name] = "i32"
    source = ASTSource(fn=fn, signature=signature,
                       constexprs={(fn.arg_names.index(name),): value for name, value in constexprs.items()})
    try:
        return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    except Exception as err:  # a missing toolchain is a skip; a compile error in the kernel is a failure
        if "ptxas" in str(err) and "error" not in str(err).lower():
            pytest.skip(f"Triton's CUDA toolchain is not usable here: {err}")
        raise


@pytest.mark.parametrize("combine", [True, False])
@pytest.mark.parametrize("logits", ["*bf16", "*fp32"])
def test_row_stats_kernel_compiles_for_sm90(combine, logits):
    from sdbench.ops.prob_verify_logits import triton_kernels as kernels

    compiled = _compile(kernels._row_stats_kernel, {"GAMMA": 8, "TILE": 1024, "COMBINE": combine, "SPLITS_PAD": 4},
                        logits)
    assert "_row_stats_kernel" in compiled.asm["ptx"]
