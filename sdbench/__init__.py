"""sdbench: kernels, references and measurements for the verification step of speculative decoding.

Library API (sdbench.api; imported on first use, so the CLI starts without loading torch):
    sdbench.verify(draft_tokens, target_tokens, impl="ballot")
    sdbench.pack(draft_kv, accepted_lengths, impl="pack_cuda")
    sdbench.verify_pack(draft_tokens, target_tokens, draft_kv, impl="auto", expected_alpha=None)
    sdbench.prob_verify(draft_tokens, target_probs, draft_probs, impl="fused", seed=0)  # rejection sampling
    ...(..., cu_num_draft_tokens=cu)  # verify, verify_pack, prob_verify: ragged γ_i, flattened inputs
    sdbench.check(outputs)   # raise on bad input flagged by the kernels (reads the flags: a sync)
"""

__version__ = "0.1.0"
__all__ = ["__version__", "check", "pack", "prob_verify", "verify", "verify_pack"]

_API = ("verify", "pack", "verify_pack", "check", "prob_verify")


def __getattr__(name: str):
    if name in _API:
        from sdbench import api

        return getattr(api, name)
    raise AttributeError(f"module 'sdbench' has no attribute {name!r}")
