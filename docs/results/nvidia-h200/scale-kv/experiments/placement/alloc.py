"""Session 42: does a verify_pack implementation's time at a point depend on where its buffers landed?

    python alloc.py POINTS COPIES OUT.json [both|outputs]

both (files 1 and 3): COPIES workloads of each point (the same seed, so the same data), each in fresh memory, all
alive; `fused` and `ballot+pack_cuda` prepared on each. outputs (file 2): one workload prepared COPIES times, so only
the outputs move. All of it timed in one rotation, CUPTI GPU time, 30 calls, cold and warm L2, beside the launch
floor. File 1 came from this script before the mode argument existed (its rows have no "mode": both).
(Names tidied after the runs; the logic is the one that ran. `scan_tiles --placements` now does what "both" does.)"""
import json
import sys

import torch

from sdbench import registry
from sdbench.commands.scan_tiles import parse_points
from sdbench.measure import timing
from sdbench.ops import make_workload
from sdbench.ops.launch_floor import launch_floor

points, copies, out_path = parse_points(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
mode = sys.argv[4] if len(sys.argv) > 4 else "both"
fused = registry.get("verify_pack", "fused")
two_step = registry.get("verify_pack", "ballot+pack_cuda")
floor = launch_floor("cuda")
rows = []
for cfg in points:
    workloads = [make_workload("verify_pack", cfg, "cuda") for _ in range(copies if mode == "both" else 1)]
    workloads = workloads * (copies // len(workloads))
    runs = {}
    for copy, workload in enumerate(workloads):
        runs[f"fused#{copy}"] = fused.prepare(workload)
        runs[f"bp_cuda#{copy}"] = two_step.prepare(workload)
    runs["floor"] = floor.run
    for l2 in ("cold", "warm"):
        options = timing.TimingOptions(warmup=5, iters=30, gpu_iters=30, cold_l2=l2 == "cold", views=("gpu",))
        timed = timing.measure(runs, "cuda", options)
        medians = {name: by_view["gpu"].stats.median_us for name, by_view in timed.items()
                   if by_view["gpu"].stats is not None}
        point = f"{cfg.batch_size}:{cfg.gamma}:{cfg.alpha:g}:{cfg.kv_dim}"
        print(f"{mode} {point} {l2} fused " + " ".join(f"{medians[f'fused#{c}']:.2f}" for c in range(copies))
              + " | bp_cuda " + " ".join(f"{medians[f'bp_cuda#{c}']:.2f}" for c in range(copies))
              + f" | floor {medians['floor']:.2f}", flush=True)
        rows.append({"mode": mode, "point": point, "l2": l2, "gpu_us": medians,
                     "addresses": [hex(workload.draft_kv.data_ptr()) for workload in workloads]})
    del workloads, runs
    torch.cuda.empty_cache()
with open(out_path, "w") as handle:
    json.dump(rows, handle, indent=1)
