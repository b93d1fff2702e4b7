"""Where each draft's acceptance comes from: integer profiles of progress and a counter-based hash.

A request's acceptance probability is a per-mille integer that depends only on its progress
`committed * 1000 // target_len` (integer division), so the CUDA loop computes the same value. Draft
position j of request i in round t is accepted iff

    hash32(seed, i, t, j) < per_mille * 2**32 // 1000        (uint64 threshold; per_mille 1000: always)

hash32 chains the lowbias32 finalizer (Wellons) over the four words, all uint32 arithmetic:

    uint32_t mix(uint32_t x) { x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu;
                               x ^= x >> 16; return x; }
    uint32_t hash32(uint32_t s, uint32_t i, uint32_t t, uint32_t j) {
      return mix(mix(mix(mix(s ^ 0x9e3779b9u) ^ i) ^ t) ^ j); }

A round accepts drafts up to the first rejection (positions after it are not looked at).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

MASK = 0xFFFFFFFF


def mix(x: int) -> int:
    x &= MASK
    x ^= x >> 16
    x = (x * 0x7FEB352D) & MASK
    x ^= x >> 15
    x = (x * 0x846CA68B) & MASK
    x ^= x >> 16
    return x


def hash32(seed: int, request: int, round_index: int, position: int) -> int:
    return mix(mix(mix(mix((seed & MASK) ^ 0x9E3779B9) ^ (request & MASK)) ^ (round_index & MASK)) ^ (position & MASK))


def threshold(per_mille: int) -> int:
    return per_mille * 2**32 // 1000


def accepted_drafts(seed: int, request: int, round_index: int, proposed: int, per_mille: int) -> int:
    """Drafts accepted before the first rejection, of `proposed`."""
    limit = threshold(per_mille)
    for position in range(proposed):
        if hash32(seed, request, round_index, position) >= limit:
            return position
    return proposed


@dataclass(frozen=True)
class Profile:
    """Acceptance per mille by progress (per mille of the target length): `phases` is a list of
    (progress at which it starts, per mille), first entry at progress 0. The device loop uses the same
    table (up to 4 phases)."""

    name: str
    phases: tuple[tuple[int, int], ...]

    def per_mille(self, committed: int, target_len: int) -> int:
        progress = committed * 1000 // target_len
        value = self.phases[0][1]
        for start, phase_value in self.phases:
            if progress >= start:
                value = phase_value
        return value


STEADY_HIGH = Profile("steady_high", ((0, 900),))
STEADY_LOW = Profile("steady_low", ((0, 300),))
DIP = Profile("dip", ((0, 900), (400, 200), (600, 900)))  # a mid-generation dip
COLLAPSE = Profile("collapse", ((0, 900), (800, 50)))  # acceptance collapses near the end
PROFILES = {profile.name: profile for profile in (STEADY_HIGH, STEADY_LOW, DIP, COLLAPSE)}
MAX_PHASES = 4


@dataclass(frozen=True)
class TraceProfile:
    """Accepted lengths replayed from a recorded trace (simulator only): round t accepts
    min(trace[t % len(trace)], proposed) drafts."""

    name: str
    accepted: Sequence[int]


AcceptanceSource = Profile | TraceProfile
Accept = Callable[[int, int, int, int], int]
