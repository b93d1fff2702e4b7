"""Per-step phase times without host syncs inside the step.

On CUDA a step records one event at each phase boundary and nothing is read until `phase_us()` (after
the loop), so timing never stalls the stream. On CPU the boundaries are perf_counter readings.
"""

from __future__ import annotations

import time

import torch

PHASES = ("draft", "target", "verify", "bookkeeping")


class PhaseClock:
    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.steps: list[list] = []

    @property
    def method(self) -> str:
        return "cuda_events" if self.cuda else "perf_counter"

    def mark(self) -> None:
        """A phase boundary: call once before the step's first phase and once after each phase."""
        if not self.steps or len(self.steps[-1]) == len(PHASES) + 1:
            self.steps.append([])
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.steps[-1].append(event)
        else:
            self.steps[-1].append(time.perf_counter())

    def phase_us(self) -> dict[str, list[float]]:
        """Microseconds of each phase for every completed step (syncs once, on CUDA)."""
        complete = [marks for marks in self.steps if len(marks) == len(PHASES) + 1]
        if self.cuda and complete:
            torch.cuda.synchronize()
        times: dict[str, list[float]] = {phase: [] for phase in PHASES}
        for marks in complete:
            for index, phase in enumerate(PHASES):
                if self.cuda:
                    times[phase].append(marks[index].elapsed_time(marks[index + 1]) * 1e3)
                else:
                    times[phase].append((marks[index + 1] - marks[index]) * 1e6)
        return times
