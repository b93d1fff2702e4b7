"""`python -m sdbench.asbs [--batch 32] [--target-len 256] [--capacity-pages N] [--seed 0]`: fixed block sizes
against ASBS on a mixed-profile batch (steady high, steady low, mid-generation dip, collapse near the end)."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from sdbench.asbs.kvcache import KVCacheModel
from sdbench.asbs.simulator import mixed_batch, simulate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--target-len", type=int, default=256)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--capacity-pages", type=int, default=None,
                        help="KV capacity in pages (default: 90%% of what max blocks would need: pressure late on)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    sources = mixed_batch(args.batch)
    capacity = args.capacity_pages or int(0.9 * args.batch * -(-(args.target_len + 8) // args.page_size))
    table = Table(title=f"ASBS vs fixed blocks: b={args.batch}, {args.target_len} tokens each, "
                        f"{capacity} pages of {args.page_size}")
    for column in ("policy", "rounds", "mean block", "block variance", "accepted / round", "tokens / round",
                   "wasted pages", "hit rate", "fragmentation"):
        table.add_column(column, justify="right" if column != "policy" else "left")
    for fixed in (1, 4, 8, None):
        kv = KVCacheModel(page_size=args.page_size, capacity_pages=capacity)
        result = simulate(sources, args.target_len, seed=args.seed, kv=kv, fixed_block=fixed)
        s = result.stats()
        table.add_row("ASBS" if fixed is None else f"fixed {fixed}", str(s["rounds"]), f"{s['mean_block']:.2f}",
                      f"{s['block_variance']:.2f}", f"{s['accepted_per_round']:.1f}", f"{s['tokens_per_round']:.1f}",
                      str(s["wasted_pages"]), f"{s['hit_rate']:.2f}", f"{s['fragmentation']:.3f}")
    Console().print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
