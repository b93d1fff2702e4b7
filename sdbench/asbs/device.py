"""The persistent ASBS loop on the GPU (csrc/asbs_loop.cu): the simulator's rounds, launched once.

    loop = DeviceLoop(mixed_batch(32), target_lens=256, seed=0)
    loop.run(rounds=1000)        # one launch; stops early when every request has finished
    loop.step()                  # one round: the same kernel with rounds = 1 (host loop, CUDA graph)
    loop.histories(), loop.committed()   # read back (syncs: never inside a timed region)

No call syncs the host: state tensors live on the device and persist across launches.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sdbench.asbs.kvcache import KVCacheModel
from sdbench.asbs.policy import AdaptiveBlockPolicy, f32
from sdbench.asbs.profiles import MAX_PHASES, Profile
from sdbench.ops.backends import cuda_ops

NEVER = 2**30  # a phase start no progress (<= 1000) reaches: pads profiles to MAX_PHASES
MAX_BATCH = 2048  # csrc/asbs_loop.cu kMaxBatch: 32 warps x 32 lanes x 2 requests held in registers


class DeviceLoop:
    def __init__(self, profiles: Sequence[Profile], target_lens: Sequence[int] | int, *, seed: int = 0,
                 policy: AdaptiveBlockPolicy = AdaptiveBlockPolicy(), kv: KVCacheModel | None = None,
                 history_rounds: int = 1024, fixed_block: int | None = None, kv_dim: int = 0,
                 device: str | torch.device = "cuda") -> None:
        batch = len(profiles)
        if not 1 <= batch <= MAX_BATCH:
            raise ValueError(f"the device loop runs 1 to {MAX_BATCH} requests in one block, got {batch}")
        lens = [target_lens] * batch if isinstance(target_lens, int) else list(target_lens)
        kv = kv if kv is not None else KVCacheModel()
        self.policy, self.seed, self.page_size, self.capacity = policy, seed, kv.page_size, kv.capacity_pages
        self.adaptive = fixed_block is None
        first_block = policy.block_for(f32(policy.initial_ema)) if fixed_block is None else fixed_block
        if not 1 <= first_block <= 32:
            raise ValueError(f"block sizes must be in [1, 32], got {first_block}")
        starts, values = [], []
        for profile in profiles:
            if len(profile.phases) > MAX_PHASES:
                raise ValueError(f"profile {profile.name} has more than {MAX_PHASES} phases")
            padded = list(profile.phases) + [(NEVER, profile.phases[-1][1])] * (MAX_PHASES - len(profile.phases))
            starts.append([start for start, _ in padded])
            values.append([value for _, value in padded])
        ints = dict(dtype=torch.int32, device=device)
        self.ema = torch.full((batch,), f32(policy.initial_ema), dtype=torch.float32, device=device)
        self.block = torch.full((batch,), first_block, **ints)
        self.committed = torch.zeros(batch, **ints)
        self.target_len = torch.tensor(lens, **ints)
        self.phase_start = torch.tensor(starts, **ints)
        self.phase_value = torch.tensor(values, **ints)
        self.history = torch.full((batch, history_rounds), -1, **ints)
        self.round_state = torch.zeros(1, **ints)
        self.kv = (torch.zeros((batch, max(lens), kv_dim), dtype=torch.float16, device=device) if kv_dim
                   else torch.empty(0, dtype=torch.float16, device=device))
        self._op = cuda_ops().asbs_loop

    def run(self, rounds: int) -> None:
        """Up to `rounds` more rounds in one launch."""
        p = self.policy
        self._op(self.ema, self.block, self.committed, self.target_len, self.phase_start, self.phase_value,
                 self.history, self.round_state, self.kv, self.seed, rounds, f32(p.alpha), f32(p.high), f32(p.low),
                 p.min_block, p.mid_block, p.max_block, p.pressure_cap, self.page_size, self.capacity, self.adaptive)

    def step(self) -> None:
        self.run(1)

    def rounds_run(self) -> int:
        return int(self.round_state.item())

    def histories(self) -> list[list[int]]:
        rows = self.history.cpu().tolist()
        return [[block for block in row if block >= 0] for row in rows]

    def committed_lengths(self) -> list[int]:
        return self.committed.cpu().tolist()
