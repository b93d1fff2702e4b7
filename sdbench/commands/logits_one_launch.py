"""A probe of issue #18's one-launch design from logits (csrc/tools/logits_one_launch.cu), against fused_logits.

    python -m sdbench.commands.logits_one_launch --points 32:4:32000:bf16,32:4:128256:bf16 --out probe.json

A point is batch:γ:V:dtype (bf16 or fp32), the grid's workload (sdbench.ops.prob_verify_logits.workload).
For each point it first checks the probe against the reference on supplied randomness (k must match at every
sequence; next tokens may differ only at near-ties, counted) and that its counters and flags are back at zero,
then times the probe (fast randomness, in-kernel Philox) and `fused_logits` interleaved in the gpu view, cold and
warm, with the launch floor of the same run, and prints each against the issue's bar (1.3 × floor + 3 µs, the
floor at the copy ceiling measured now). `--lags` times the probe at several lags (a sequence's race items
follow the stats items of that many later sequences; `auto` is one wave of stats items, `w<N>` N waves, and a
lag of B or more puts every race item after every stats item).

A probe, not a design in the registry: it has no input validation and no error contract beyond what the check
needs, and it builds only where torch has CUDA headers (never in CPU CI).
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

import torch

CSRC_TOOLS = Path(__file__).resolve().parents[2] / "csrc" / "tools"
THREADS = 256
STATS_STEPS = 4  # kStatsSteps in the .cu: 16-byte loads a thread, so a group of a stats item is 16 KiB
DTYPES = {"bf16": "bfloat16", "fp32": "float32"}
STUCK = 99  # kStuck: a race item gave up waiting for its sequence

WRAPPER = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include "logits_one_launch.h"

int64_t blocks_per_sm(bool bf16) { return probe_blocks_per_sm(bf16); }

template <typename T> T* ptr(const torch::Tensor& t) { return t.numel() ? static_cast<T*>(t.data_ptr()) : nullptr; }

void launch(torch::Tensor target, torch::Tensor draft, torch::Tensor tokens, torch::Tensor target_t,
            torch::Tensor draft_t, torch::Tensor uniforms, torch::Tensor noise, std::vector<int64_t> sizes,
            std::vector<torch::Tensor> state, std::vector<torch::Tensor> outputs, int64_t grid) {
  TORCH_CHECK(sizes.size() == 10 && state.size() == 11 && outputs.size() == 4, "probe: wrong argument counts");
  probe::Args a{};
  a.target = target.data_ptr(); a.draft = draft.data_ptr(); a.tokens = ptr<int64_t>(tokens);
  a.target_temperature = ptr<float>(target_t); a.draft_temperature = ptr<float>(draft_t);
  a.uniforms = ptr<float>(uniforms); a.noise = ptr<float>(noise);
  a.batch = sizes[0]; a.gamma = sizes[1]; a.vocab = sizes[2]; a.splits = sizes[3]; a.span = sizes[4];
  a.chunks = sizes[5]; a.chunk = sizes[6]; a.lag = sizes[7]; a.seed = sizes[8]; a.offset = sizes[9];
  a.part_max = ptr<float>(state[0]); a.part_sum = ptr<float>(state[1]); a.part_arg = ptr<int>(state[2]);
  a.arrivals = ptr<unsigned>(state[3]); a.race_arrivals = ptr<unsigned>(state[4]); a.ready = ptr<int>(state[5]);
  a.race_info = ptr<float>(state[6]); a.race_key = ptr<float>(state[7]); a.race_arg = ptr<int>(state[8]);
  a.fallback_key = ptr<float>(state[9]); a.fallback_arg = ptr<int>(state[10]);
  a.accepted_lengths = ptr<int64_t>(outputs[0]); a.next_tokens = ptr<int64_t>(outputs[1]);
  a.output_tokens = ptr<int64_t>(outputs[2]); a.error_flags = ptr<int32_t>(outputs[3]);
  int err = probe_launch(a, target.scalar_type() == torch::kBFloat16, grid,
                         c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == 0, "probe launch failed: ", err);
}
"""


def build(min_blocks: int = 4):
    from torch.utils import cpp_extension

    from sdbench.ext import host_compiler

    os.environ["CXX"] = host_compiler()  # (sdbench.ext: a compiler that links the shared C++ runtime)
    return cpp_extension.load_inline(
        name=f"sdbench_logits_one_launch_probe_mb{min_blocks}", cpp_sources=[WRAPPER],
        cuda_sources=[(CSRC_TOOLS / "logits_one_launch.cu").read_text()], functions=["blocks_per_sm", "launch"],
        extra_include_paths=[str(CSRC_TOOLS)], extra_cuda_cflags=["-O3", "-lineinfo", f"-DPROBE_MIN_BLOCKS={min_blocks}"],
        verbose=os.environ.get("SDBENCH_BUILD_VERBOSE", "") not in ("", "0"))


class Probe:
    """One prepared probe call on workload w: `run()` launches it (outputs in `outputs`, state in `state`)."""

    def __init__(self, module, w, lag: str | int = "auto", chunk_steps: int = 1, supplied: bool = False,
                 groups: str | int = "auto"):
        batch, gamma, vocab = w.draft_logits.shape
        if gamma > 31 or vocab % (16 // w.target_logits.element_size()):
            raise ValueError("the probe takes γ <= 31 and V a multiple of a 16-byte lane")
        lane = 16 // w.target_logits.element_size()
        bf16 = w.target_logits.dtype == torch.bfloat16
        sms = torch.cuda.get_device_properties(w.target_logits.device).multi_processor_count
        self.grid = module.blocks_per_sm(bf16) * sms  # every block resident: the list's progress needs it
        group = STATS_STEPS * THREADS * lane  # columns of a 16 KiB group
        row_groups = math.ceil(vocab / group)
        if groups == "auto":  # as few groups an item as still give every block a stats item
            splits = min(row_groups, max(1, math.ceil(self.grid / (batch * (2 * gamma + 1)))))
            groups = math.ceil(row_groups / splits)
        span = int(groups) * group
        splits = math.ceil(vocab / span)
        chunk = chunk_steps * THREADS * lane
        chunks = math.ceil(vocab / chunk)
        self.groups = int(groups)
        stats_items = (2 * gamma + 1) * splits
        if lag == "auto" or str(lag).startswith("w"):  # N waves of stats items (auto: one)
            waves = 1 if lag == "auto" else int(str(lag)[1:])
            self.lag = min(batch, math.ceil(waves * self.grid / stats_items))
        else:
            self.lag = min(batch, int(lag))  # B: every race item after every stats item
        self.module, self.w, self.supplied = module, w, supplied
        rows = 2 * gamma + 1
        dev = w.target_logits.device
        f32, i32 = dict(dtype=torch.float32, device=dev), dict(dtype=torch.int32, device=dev)
        self.state = [torch.zeros(batch * rows * splits, **f32), torch.zeros(batch * rows * splits, **f32),  # partials
                      torch.zeros(batch * rows * splits, **i32),
                      torch.zeros(batch, **i32), torch.zeros(batch, **i32), torch.zeros(batch, **i32),  # counters, flag
                      torch.zeros(batch * 8, **f32),  # race_info
                      torch.zeros(batch * chunks, **f32), torch.zeros(batch * chunks, **i32),  # chunks' keys
                      torch.zeros(batch * chunks, **f32), torch.zeros(batch * chunks, **i32)]
        self.outputs = [torch.full((batch,), -7, dtype=torch.int64, device=dev),  # poisoned
                        torch.full((batch,), -7, dtype=torch.int64, device=dev),
                        torch.full((batch, gamma + 1), -7, dtype=torch.int64, device=dev),
                        torch.full((batch,), -7, **i32)]
        empty = torch.empty(0, **f32)
        self.uniforms = w.uniforms if supplied else empty
        self.noise = w.exponential_noise if supplied else empty
        self.sizes = [batch, gamma, vocab, splits, span, chunks, chunk, self.lag, w.seed, 0]

    def run(self):
        w = self.w
        self.module.launch(w.target_logits, w.draft_logits, w.draft_tokens.long(), w.target_temperature,
                           w.draft_temperature, self.uniforms, self.noise, self.sizes, self.state, self.outputs,
                           self.grid)

    def counters_at_zero(self) -> bool:
        return all(int(self.state[i].count_nonzero()) == 0 for i in (3, 4, 5))  # arrivals, race arrivals, ready


def check(module, w, lag: str | int = "auto", chunk_steps: int = 1, groups: str | int = "auto") -> dict:
    """The probe on supplied randomness against the reference: k and the error flags at every sequence, next
    tokens (near-ties allowed: counted), drafts before k, -1 after; the counters back at zero after each of two
    calls (the second reuses the first's state). Raises AssertionError on a wrong k, flag or counter."""
    from sdbench.ops.prob_verify_logits.reference import reference_outputs

    probe = Probe(module, w, lag=lag, chunk_steps=chunk_steps, supplied=True, groups=groups)
    expected = reference_outputs(w)
    result = {}
    for call in range(2):
        probe.run()
        torch.cuda.synchronize()
        accepted, next_tokens, output_tokens, _ = probe.outputs
        k_mismatch = int((accepted != expected["accepted_lengths"]).sum())
        token_mismatch = int((next_tokens != expected["next_tokens"].long()).sum())
        out_mismatch = int((output_tokens != expected["output_tokens"].long()).any(dim=1).sum())
        stuck = int((probe.outputs[3] == STUCK).sum())
        flags_mismatch = int((probe.outputs[3] != expected["error_flags"]).sum())
        result = dict(k_mismatch=k_mismatch, token_mismatch=token_mismatch, rows_mismatch=out_mismatch,
                      flags_mismatch=flags_mismatch,
                      zero_after=probe.counters_at_zero(), stuck=stuck, mean_k=float(accepted.double().mean()))
        if k_mismatch or stuck or flags_mismatch or not result["zero_after"]:
            raise AssertionError(f"probe wrong on call {call}: {result}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", required=True)
    parser.add_argument("--lags", default="auto", help="comma list: auto or integers")
    parser.add_argument("--chunk-steps", default="1", help="comma list: race chunk = steps × 256 16-byte lanes")
    parser.add_argument("--groups", default="auto", help="comma list: 16 KiB groups a stats item (auto: as few as "
                        "still give every block one)")
    parser.add_argument("--min-blocks", default="4", help="comma list: the kernel's blocks an SM at the least "
                        "(its register cap), one build each")
    parser.add_argument("--l2", default="cold,warm")
    parser.add_argument("--gpu-iters", type=int, default=20)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    from sdbench import registry
    from sdbench.commands.logits_bench import copy_ceiling_tbps
    from sdbench.commands.logits_summary import bar_us
    from sdbench.measure.timing import LAUNCH_FLOOR, TimingOptions, measure
    from sdbench.ops.launch_floor import path_floor
    from sdbench.ops.prob_verify_logits.workload import LogitsConfig, logits_read_floor_bytes, make_logits_workload

    modules = {int(n): build(int(n)) for n in args.min_blocks.split(",")}
    device = "cuda"
    tbps = copy_ceiling_tbps(device)
    print(f"copy ceiling {tbps:.3f} TB/s; {torch.cuda.get_device_name()}", flush=True)
    floor = path_floor("triton_bound", device)
    rows = []
    for point in args.points.split(","):
        batch, gamma, vocab, dtype = point.split(":")
        cfg = LogitsConfig(batch_size=int(batch), gamma=int(gamma), vocab_size=int(vocab), logits_dtype=DTYPES[dtype])
        supplied = make_logits_workload(cfg, device)
        checked = {f"b{mb}": check(built, supplied) for mb, built in modules.items()}
        del supplied
        w = make_logits_workload(cfg, device).with_randomness("fast")
        floor_us = logits_read_floor_bytes(cfg) / (tbps * 1e12) * 1e6
        calls = {"fused_logits": registry.get("prob_verify_logits", "fused_logits").prepare(w)}
        probes = {}
        for lag in args.lags.split(","):
            for steps in args.chunk_steps.split(","):
                for groups in args.groups.split(","):
                    for min_blocks, built in modules.items():
                        probe = Probe(built, w, lag=lag, chunk_steps=int(steps), groups=groups)
                        name = f"probe_lag{probe.lag}_c{steps}_g{probe.groups}_b{min_blocks}"
                        probes[name] = probe
                        calls[name] = probe.run
        if floor.run is not None:
            calls[LAUNCH_FLOOR] = floor.run
        for l2 in args.l2.split(","):
            options = TimingOptions(warmup=5, iters=30, gpu_iters=args.gpu_iters, cold_l2=l2 == "cold",
                                    views=("gpu",))
            timed = measure(calls, device, options)
            launch = timed.get(LAUNCH_FLOOR, {}).get("gpu")
            launch_us = launch.stats.median_us if launch is not None and launch.stats else float("nan")
            for name, views in timed.items():
                if name == LAUNCH_FLOOR:
                    continue
                stats = views["gpu"].stats
                us = stats.median_us if stats else float("nan")
                row = dict(point=point, l2=l2, design=name, gpu_us=round(us, 2), floor_us=round(floor_us, 2),
                           bar_us=round(bar_us(floor_us), 2), vs_bar=round(us / bar_us(floor_us), 3),
                           launch_floor_us=round(launch_us, 2), copy_tbps=round(tbps, 3), check=checked)
                if name in probes:
                    probe = probes[name]
                    row.update(grid=probe.grid, lag=probe.lag, groups=probe.groups, zero_after=probe.counters_at_zero(),
                               stuck=int((probe.outputs[3] == STUCK).sum()))
                rows.append(row)
                print(f"{point:18s} {l2:4s} {name:22s} {us:8.2f} µs  floor {floor_us:6.2f}  bar {bar_us(floor_us):6.2f}"
                      f"  ÷bar {us / bar_us(floor_us):.3f}  launch {launch_us:.2f}", flush=True)
        print(f"{'':18s} check: {checked}", flush=True)
        del calls, probes, w
        torch.cuda.empty_cache()
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
