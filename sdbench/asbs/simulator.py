"""The round loop: the specification the persistent CUDA loop (csrc/asbs_loop.cu) reproduces bit for bit.

Round t, for all unfinished requests at once:
  1. pressure = KVCacheModel.under_pressure over (committed_i, current_block_i) of the unfinished requests;
  2. per unfinished request i, in any order (no request reads another's state):
       proposed   = current_block_i (fixed mode: the fixed size)
       accepted   = drafts before the first rejection (profiles.accepted_drafts(seed, i, t, proposed, ‰))
                    with ‰ from the request's profile at its progress before the round
       history_i += [proposed]
       committed_i += min(accepted + 1, target_len_i − committed_i)   (the +1: the target's own token)
       (ε_i, current_block_i) = update_block_size(ε_i, accepted, proposed, pressure)   (adaptive mode)
       finished once committed_i >= target_len_i
  3. stop when every request has finished or after max_rounds rounds.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from sdbench.asbs.kvcache import KVCacheModel
from sdbench.asbs.policy import AdaptiveBlockPolicy, RequestState, update_block_size
from sdbench.asbs.profiles import AcceptanceSource, Profile, TraceProfile, accepted_drafts


@dataclass
class SimulatedRequest:
    source: AcceptanceSource
    target_len: int
    state: RequestState
    committed: int = 0
    accepted_history: list[int] = field(default_factory=list)
    pressure_history: list[bool] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.committed >= self.target_len


@dataclass
class SimulationResult:
    requests: list[SimulatedRequest]
    rounds: int
    kv: KVCacheModel
    fixed_block: int | None

    def histories(self) -> list[list[int]]:
        return [request.state.block_size_history for request in self.requests]

    def committed(self) -> list[int]:
        return [request.committed for request in self.requests]

    def stats(self) -> dict[str, float]:
        blocks = [block for request in self.requests for block in request.state.block_size_history]
        accepted = sum(sum(request.accepted_history) for request in self.requests)
        return {
            "rounds": self.rounds,
            "mean_block": statistics.fmean(blocks) if blocks else 0.0,
            "block_variance": statistics.pvariance(blocks) if len(blocks) > 1 else 0.0,
            "accepted_per_round": accepted / self.rounds if self.rounds else 0.0,
            "tokens_per_round": sum(self.committed()) / self.rounds if self.rounds else 0.0,
            "wasted_pages": self.kv.wasted_pages,
            "hit_rate": self.kv.hit_rate,
            "fragmentation": self.kv.fragmentation(self.committed()),
        }


def _accepted(source: AcceptanceSource, seed: int, index: int, round_index: int, proposed: int,
              committed: int, target_len: int) -> int:
    if isinstance(source, TraceProfile):
        return min(int(source.accepted[round_index % len(source.accepted)]), proposed)
    return accepted_drafts(seed, index, round_index, proposed, source.per_mille(committed, target_len))


def simulate(sources: Sequence[AcceptanceSource], target_lens: Sequence[int] | int, *, seed: int = 0,
             policy: AdaptiveBlockPolicy = AdaptiveBlockPolicy(), kv: KVCacheModel | None = None,
             max_rounds: int = 10_000, fixed_block: int | None = None) -> SimulationResult:
    lens = [target_lens] * len(sources) if isinstance(target_lens, int) else list(target_lens)
    if len(lens) != len(sources) or min(lens, default=1) < 1:
        raise ValueError("one target length >= 1 per request")
    kv = kv if kv is not None else KVCacheModel()
    requests = []
    for source, target_len in zip(sources, lens, strict=True):
        state = RequestState.start(policy)
        if fixed_block is not None:
            state.current_block_size = fixed_block
        requests.append(SimulatedRequest(source, target_len, state))
    rounds = 0
    for round_index in range(max_rounds):
        active = [(index, request) for index, request in enumerate(requests) if not request.finished]
        if not active:
            break
        pressure = kv.under_pressure((r.committed, r.state.current_block_size) for _, r in active)
        for index, request in active:
            proposed = request.state.current_block_size
            before = request.committed
            accepted = _accepted(request.source, seed, index, round_index, proposed, before, request.target_len)
            request.state.block_size_history.append(proposed)
            request.accepted_history.append(accepted)
            request.pressure_history.append(pressure)
            request.committed = before + min(accepted + 1, request.target_len - before)
            kv.record_round(before, proposed, accepted, request.committed)
            if fixed_block is None:
                ema, block = update_block_size(request.state, accepted, proposed, pressure, policy)
                request.state.ema_acceptance_rate, request.state.current_block_size = ema, block
        rounds = round_index + 1
    return SimulationResult(requests, rounds, kv, fixed_block)


def mixed_batch(batch: int) -> list[Profile]:
    """The four profiles in turn: the batch the benchmark runner and the device tests use."""
    from sdbench.asbs.profiles import COLLAPSE, DIP, STEADY_HIGH, STEADY_LOW

    order = (STEADY_HIGH, STEADY_LOW, DIP, COLLAPSE)
    return [order[index % len(order)] for index in range(batch)]
