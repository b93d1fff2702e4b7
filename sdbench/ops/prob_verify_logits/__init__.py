"""prob_verify_logits: probabilistic verification straight from logits (issue #18).

p = softmax(target_logits / T) and q = softmax(draft_logits / T_draft) are computed inside the step,
per request temperature, T = 0 meaning greedy for that request. workload.py makes the inputs and the
benchmark grid, reference.py defines the step (token rule and block verification), triton_kernels.py
holds sdbench's two-launch kernel and the vLLM-v2-style multi-kernel peer, *_impls.py register them.
"""
