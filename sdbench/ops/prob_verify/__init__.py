"""prob_verify: probabilistic (Leviathan) verification with the residual draw.

workload.py makes its inputs, reference.py defines it, triton_kernels.py holds its Triton kernels,
*_impls.py register every implementation (torch, triton, flashinfer).
"""
