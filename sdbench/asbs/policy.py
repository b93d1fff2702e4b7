"""The block-size policy: an EMA of each request's acceptance rate picks its next speculative block size.

Bit-exactness contract (the CUDA loop reproduces it; csrc/asbs_loop.cu): all EMA arithmetic is float32,
each operation rounded to float32, in this order:
    r  = f32(accepted) / f32(proposed)
    a  = f32(alpha) * r
    b  = (1 - f32(alpha)) * ε          (1 - alpha rounded to float32 first)
    ε' = a + b
    block = max_block if ε' >= f32(high) else mid_block if ε' >= f32(low) else min_block
    block = min(block, pressure_cap) under KV pressure
Python computes each step in float64 and rounds to float32 (`f32`): for + − × ÷ of float32 operands the
double rounding is innocuous (53 >= 2·24 + 2), so this equals IEEE float32 arithmetic. CUDA uses
__fdiv_rn / __fmul_rn / __fadd_rn / __fsub_rn, which forbid the FMA contraction that would round once.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field


def f32(value: float) -> float:
    """value rounded to the nearest float32 (as a Python float)."""
    return struct.unpack("f", struct.pack("f", value))[0]


@dataclass(frozen=True)
class AdaptiveBlockPolicy:
    alpha: float = 0.2  # EMA weight of the newest round
    high: float = 0.80  # ε' >= high: the largest block
    low: float = 0.50  # ε' >= low: the middle block; below: the smallest
    min_block: int = 1
    mid_block: int = 4
    max_block: int = 8
    pressure_cap: int = 2  # the largest block while the KV cache is under pressure
    initial_ema: float = 0.8

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {self.alpha}")
        if not 0.0 <= self.low <= self.high <= 1.0:
            raise ValueError(f"need 0 <= low <= high <= 1, got low={self.low}, high={self.high}")
        if not 1 <= self.min_block <= self.mid_block <= self.max_block:
            raise ValueError(f"need 1 <= min <= mid <= max block, got {self.min_block}/{self.mid_block}/{self.max_block}")
        if self.pressure_cap < 1:
            raise ValueError(f"pressure_cap must be >= 1, got {self.pressure_cap}")

    def block_for(self, ema: float, under_pressure: bool = False) -> int:
        """The block size an EMA value (already float32) selects."""
        if ema >= f32(self.high):
            block = self.max_block
        elif ema >= f32(self.low):
            block = self.mid_block
        else:
            block = self.min_block
        return min(block, self.pressure_cap) if under_pressure else block


@dataclass
class RequestState:
    """One request: its acceptance EMA, the block it proposes next, and every block it proposed."""

    ema_acceptance_rate: float
    current_block_size: int
    block_size_history: list[int] = field(default_factory=list)

    @classmethod
    def start(cls, policy: AdaptiveBlockPolicy) -> RequestState:
        ema = f32(policy.initial_ema)
        return cls(ema_acceptance_rate=ema, current_block_size=policy.block_for(ema))


def update_block_size(request: RequestState, accepted: int, proposed: int, under_pressure: bool,
                      policy: AdaptiveBlockPolicy = AdaptiveBlockPolicy()) -> tuple[float, int]:
    """(ε', next block size) after a round where `accepted` of `proposed` drafts were accepted. Pure: the
    caller stores them (so a simulator and a test can ask without changing the request)."""
    if proposed < 1 or not 0 <= accepted <= proposed:
        raise ValueError(f"need 0 <= accepted <= proposed and proposed >= 1, got {accepted}/{proposed}")
    alpha = f32(policy.alpha)
    rate = f32(f32(float(accepted)) / f32(float(proposed)))
    newest = f32(alpha * rate)
    kept = f32(f32(1.0 - alpha) * request.ema_acceptance_rate)
    ema = f32(newest + kept)
    return ema, policy.block_for(ema, under_pressure)
