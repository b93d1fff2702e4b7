"""Session 42 (files 4 and 4b): COPIES copies of one verify_pack workload in fresh memory, IMPL prepared on each; every
copy's run called once (warm-up), then once more: the launches ncu profiles.

    ncu --clock-control none --cache-control all --kernel-name "regex:scan_pack_kernel|pack_replicated_kernel" \\
        --launch-skip 6 --launch-count 6 --csv --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,\\
dram__bytes_read.sum,dram__bytes_write.sum,dram__bytes.avg,dram__bytes.max,dram__bytes.min,lts__t_sectors.avg,lts__t_sectors.max,\\
lts__t_sectors.min,lts__t_sector_hit_rate.pct,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_write.sum,\\
sm__cycles_active.avg,sm__cycles_active.max,sm__cycles_elapsed.avg \\
        python ncu_copies.py 1024:8:0.3:4096 6 fused            (then ballot+pack_cuda)"""
import sys

import torch

from sdbench import registry
from sdbench.commands.scan_tiles import parse_points
from sdbench.ops import make_workload

cfg = parse_points(sys.argv[1])[0]
copies = int(sys.argv[2])
implementation = registry.get("verify_pack", sys.argv[3] if len(sys.argv) > 3 else "fused")
workloads = [make_workload("verify_pack", cfg, "cuda") for _ in range(copies)]
runs = [implementation.prepare(workload) for workload in workloads]
for run in runs:
    run()
torch.cuda.synchronize()
for run in runs:
    run()
    torch.cuda.synchronize()
print("draft_kv", [hex(workload.draft_kv.data_ptr()) for workload in workloads])
