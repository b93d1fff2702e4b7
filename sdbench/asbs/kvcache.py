"""A KV-cache model: committed pages hold accepted tokens, draft pages are allocated for each round's
proposals and discarded when their tokens are rejected.

    pages(n)      = ceil(n / page_size)
    live pages    = Σ over unfinished requests of pages(committed_i + block_i)   (this round's drafts included)
    under pressure  iff  live * 100 > 85 * capacity_pages                        (integers only)
    wasted pages  = per request and round, pages(committed + proposed) − pages(committed after the round)
                    when positive: draft pages allocated and then discarded
    fragmentation = (allocated slots − committed tokens) / allocated slots, over committed pages at the end
    hit rate      = accepted drafts / drafted tokens (the share of draft slots that were kept)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

PRESSURE_PERCENT = 85


def pages(tokens: int, page_size: int) -> int:
    return -(-tokens // page_size)


@dataclass
class KVCacheModel:
    page_size: int = 16
    capacity_pages: int = 1 << 30  # effectively unbounded unless given
    wasted_pages: int = 0
    drafted_tokens: int = 0
    accepted_drafts: int = 0

    def live_pages(self, committed_and_blocks: Iterable[tuple[int, int]]) -> int:
        return sum(pages(committed + block, self.page_size) for committed, block in committed_and_blocks)

    def under_pressure(self, committed_and_blocks: Iterable[tuple[int, int]]) -> bool:
        return self.live_pages(committed_and_blocks) * 100 > PRESSURE_PERCENT * self.capacity_pages

    def record_round(self, committed_before: int, proposed: int, accepted: int, committed_after: int) -> None:
        allocated = pages(committed_before + proposed, self.page_size)
        self.wasted_pages += max(allocated - pages(committed_after, self.page_size), 0)
        self.drafted_tokens += proposed
        self.accepted_drafts += accepted

    def fragmentation(self, committed: Iterable[int]) -> float:
        committed = list(committed)
        allocated = sum(pages(count, self.page_size) * self.page_size for count in committed)
        return (allocated - sum(committed)) / allocated if allocated else 0.0

    @property
    def hit_rate(self) -> float:
        return self.accepted_drafts / self.drafted_tokens if self.drafted_tokens else 0.0
