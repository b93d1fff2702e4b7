"""Adaptive speculative block sizing (ASBS): the Python specification of the device loop.

    policy.py     AdaptiveBlockPolicy, RequestState, update_block_size (EMA in float32, bit for bit)
    profiles.py   acceptance profiles as integer functions of progress, and the counter-based hash32
    kvcache.py    committed pages, discardable draft pages, the pressure rule
    simulator.py  the round loop the CUDA kernel copies (csrc/asbs_loop.cu), fixed-block or adaptive
    __main__.py   `python -m sdbench.asbs`: fixed block sizes against ASBS on a mixed-profile batch

docs/asbs.md states the contract the kernel reproduces (round order, generator, pressure, arithmetic).
"""
