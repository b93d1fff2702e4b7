"""verify: greedy verification. reference.py defines it; *_impls.py implement it."""
