"""pack: compaction of the accepted KV rows. reference.py defines it; *_impls.py implement it."""
