"""Session 42 (file 5): fused_scan's tile rules on COPIES copies of one workload (fresh memory each, all alive), one
rotation, CUPTI GPU time, beside `ballot+pack_cuda` and the launch floor: does a finer or longer grid shrink the
spread over placements, or the median?

    python tile_rules.py POINTS COPIES VARIANTS OUT.json     (VARIANTS: scan_tiles' variants, e.g. default,t128,t64,w2)

(Names tidied after the run; the logic is the one that ran. `scan_tiles --placements COPIES --variants …` now does
the same.)"""
import json
import statistics
import sys

import torch

from sdbench import registry
from sdbench.commands.scan_tiles import parse_points, tiling
from sdbench.measure import timing
from sdbench.ops import make_workload
from sdbench.ops.launch_floor import launch_floor
from sdbench.ops.verify_pack.scan_impls import prepare_fused_scan

points, copies, variants, out_path = parse_points(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split(","), sys.argv[4]
two_step = registry.get("verify_pack", "ballot+pack_cuda")
floor = launch_floor("cuda")
rows = []
for cfg in points:
    workloads = [make_workload("verify_pack", cfg, "cuda") for _ in range(copies)]
    runs = {}
    for copy, workload in enumerate(workloads):
        for variant in variants:
            runs[f"{variant}#{copy}"] = prepare_fused_scan(workload, **tiling(variant))
        runs[f"bp_cuda#{copy}"] = two_step.prepare(workload)
    runs["floor"] = floor.run
    for l2 in ("cold", "warm"):
        options = timing.TimingOptions(warmup=5, iters=30, gpu_iters=30, cold_l2=l2 == "cold", views=("gpu",))
        timed = timing.measure(runs, "cuda", options)
        medians = {name: by_view["gpu"].stats.median_us for name, by_view in timed.items()
                   if by_view["gpu"].stats is not None}
        line = f"{cfg.batch_size}:{cfg.gamma}:{cfg.alpha:g}:{cfg.kv_dim} {l2}"
        for name in [*variants, "bp_cuda"]:
            values = [medians[f"{name}#{copy}"] for copy in range(copies)]
            line += f" | {name} {statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"
        print(line + f" | floor {medians['floor']:.2f}", flush=True)
        rows.append({"point": line.split()[0], "l2": l2, "gpu_us": medians})
    del workloads, runs
    torch.cuda.empty_cache()
with open(out_path, "w") as handle:
    json.dump(rows, handle, indent=1)
