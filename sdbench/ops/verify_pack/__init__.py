"""verify_pack: greedy verification and KV packing in one step. reference.py defines it; *_impls.py implement it."""
