"""`sdbench e2e`: batched speculative decoding end to end, every verification implementation in its loop.

    from sdbench.e2e import E2EOptions, run_e2e
    result = run_e2e(E2EOptions(target="ckpt/target", draft="ckpt/draft", verify_impls=("ballot",)))

Modules: slots (cache layout and masks), speculative (the loop and the target-alone peer), verifier (the
only adapter to the rest of sdbench), models (loading local checkpoints), builtin (the trained pair),
clock (phase timing), results (parquet schema, trace), run (options -> rows). See docs/e2e.md.
"""

from sdbench.e2e.run import E2EOptions, E2EResult, run_e2e

__all__ = ["E2EOptions", "E2EResult", "run_e2e"]
