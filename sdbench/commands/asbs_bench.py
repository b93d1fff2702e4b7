"""Per-round cost of the ASBS loop on the GPU: one persistent launch for R rounds, against one launch per
round from a host loop and the same R launches replayed as one CUDA graph (issue #16).

    python -m sdbench.commands.asbs_bench --out asbs.csv [--b 1,8,32,128] [--rounds 10,100,1000]

Requests never finish inside the timed rounds (target length 10^6), so every launch does R rounds of
work. Wall time from CUDA events around each variant (events created before timing), median of
--repeats, divided by R; the launch floor of the same run is R empty-kernel launches from the host loop.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys

import torch

from sdbench.asbs.device import DeviceLoop
from sdbench.asbs.kvcache import KVCacheModel
from sdbench.asbs.simulator import mixed_batch

LONG = 10**6


def _timed(function, repeats: int) -> float:
    """Median milliseconds of function() between two CUDA events (events made up front)."""
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
    function()  # warm
    torch.cuda.synchronize()
    times = []
    for start, stop in events:
        start.record()
        function()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def measure_point(batch: int, rounds: int, fixed: int | None, repeats: int, kv_dim: int = 0) -> dict:
    profiles = mixed_batch(batch)
    kv = KVCacheModel(page_size=16, capacity_pages=10**9)

    def fresh() -> DeviceLoop:
        return DeviceLoop(profiles, LONG, seed=0, kv=kv, fixed_block=fixed, history_rounds=rounds * (repeats + 3),
                          kv_dim=kv_dim)

    persistent, stepped, graphed = fresh(), fresh(), fresh()
    row = {"batch": batch, "rounds": rounds, "policy": "ASBS" if fixed is None else f"fixed {fixed}"}
    row["persistent_us_per_round"] = _timed(lambda: persistent.run(rounds), repeats) * 1e3 / rounds

    def host_loop():
        for _ in range(rounds):
            stepped.step()

    row["host_loop_us_per_round"] = _timed(host_loop, repeats) * 1e3 / rounds
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fresh().step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(rounds):
            graphed.step()
    row["graph_us_per_round"] = _timed(graph.replay, repeats) * 1e3 / rounds
    row["mean_block"] = round(float(persistent.history[:, :rounds].float().mean()), 3)
    return row


def launch_floor_us(rounds: int, repeats: int) -> float:
    from sdbench.ops.backends import cuda_ops

    empty, dummy = cuda_ops().empty, torch.empty(1, device="cuda")

    def host_loop():
        for _ in range(rounds):
            empty(dummy)

    return _timed(host_loop, repeats) * 1e3 / rounds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--b", default="1,8,32,128")
    parser.add_argument("--rounds", default="10,100,1000")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    rows = []
    for rounds in (int(word) for word in args.rounds.split(",")):
        floor = launch_floor_us(rounds, args.repeats)
        for batch in (int(word) for word in args.b.split(",")):
            for fixed in (8, None):
                row = measure_point(batch, rounds, fixed, args.repeats)
                row["launch_floor_us_per_launch"] = round(floor, 3)
                rows.append({key: round(value, 3) if isinstance(value, float) else value for key, value in row.items()})
                print(rows[-1], file=sys.stderr, flush=True)
    with open(args.out, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
