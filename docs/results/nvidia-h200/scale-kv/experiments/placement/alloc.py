"""Session 42: does fused's time at a point depend on where its buffers landed? K copies of one workload
(same seed, same data), each in fresh memory, all alive; fused and ballot+pack_cuda prepared on each and timed
in one rotation (CUPTI GPU time), with the launch floor."""
import sys, json
import torch
from sdbench import registry
from sdbench.measure import timing
from sdbench.ops import make_workload
from sdbench.ops.launch_floor import launch_floor
from sdbench.commands.scan_tiles import parse_points

points = parse_points(sys.argv[1]); copies = int(sys.argv[2]); out = sys.argv[3]
mode = sys.argv[4] if len(sys.argv) > 4 else "both"  # both: K workloads; outputs: one workload prepared K times
fused = registry.get("verify_pack", "fused"); two = registry.get("verify_pack", "ballot+pack_cuda")
floor = launch_floor("cuda")
rows = []
for cfg in points:
    workloads = [make_workload("verify_pack", cfg, "cuda") for _ in range(copies if mode == "both" else 1)] 
    workloads = workloads * (copies // len(workloads))
    runs = {}
    for i, w in enumerate(workloads):
        runs[f"fused#{i}"] = fused.prepare(w)
        runs[f"bp_cuda#{i}"] = two.prepare(w)
    runs["floor"] = floor.run
    for l2 in ("cold", "warm"):
        opts = timing.TimingOptions(warmup=5, iters=30, gpu_iters=30, cold_l2=l2 == "cold", views=("gpu",))
        res = timing.measure(runs, "cuda", opts)
        med = {k: v["gpu"].stats.median_us for k, v in res.items() if v["gpu"].stats is not None}
        f = [med[f"fused#{i}"] for i in range(copies)]; b = [med[f"bp_cuda#{i}"] for i in range(copies)]
        print(f"{mode} {cfg.batch_size}:{cfg.gamma}:{cfg.alpha:g}:{cfg.kv_dim} {l2} fused " + " ".join(f"{x:.2f}" for x in f)
              + f" | bp_cuda " + " ".join(f"{x:.2f}" for x in b) + f" | floor {med['floor']:.2f}", flush=True)
        rows.append({"mode": mode, "point": f"{cfg.batch_size}:{cfg.gamma}:{cfg.alpha:g}:{cfg.kv_dim}", "l2": l2, "gpu_us": med,
                     "addresses": [hex(w.draft_kv.data_ptr()) for w in workloads]})
    del workloads, runs
    torch.cuda.empty_cache()
json.dump(rows, open(out, "w"), indent=1)
