"""What the memory stage records of a run (plain data; imports nothing of the package)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class PeakSite:
    """A line of the user's code (`train.py:42`, or what training holds from before the step:
    `parameters`, `gradients`, `optimizer state`) and the bytes its tensors held at the peak."""

    site: str
    bytes: int
    tensors: int


@dataclass
class Memory:
    """One step's peak and what fills it (`memory.step`): `breakdown` has `parameters`,
        `gradients`, `optimizer_state`, `activations` and `other`, in bytes, adding up to the peak
        (where the parts were not all alive at once, `note` says so); the step over time and the lines
    whose tensors hold its peak. `budget_bytes`: the memory the
        run may use (`--memory-budget`, or on a GPU what the allocator may use), when known."""

    status: str  # "measured", or why not
    peak_bytes: int | None = None
    breakdown: dict[str, int] = field(default_factory=dict)
    peak_source: str = ""
    note: str = ""
    budget_bytes: int | None = None
    budget_source: str = ""
    # the step's live bytes over its operators (at most 240 points, the most of each stretch;
    # on a GPU the tensors' own bytes, the allocator's rounding and cache aside)
    timeline_bytes: list[int] = field(default_factory=list)
    peak_sites: list[PeakSite] = field(default_factory=list)  # largest first

    @property
    def fits(self) -> bool | None:
        if self.peak_bytes is None or self.budget_bytes is None:
            return None
        return self.peak_bytes <= self.budget_bytes
