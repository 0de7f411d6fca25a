"""Records of a job across ranks: its critical path (`analyze.run.critical_path`) and each rank's
communication. Plain data, saved in report.json."""

from __future__ import annotations

from dataclasses import dataclass, field

CAUSES = ("data", "compute", "host", "communication")
PHASES = ("data", "forward", "backward", "optimizer", "other")  # `analyze.trace.phases.PHASES`
NOTABLE_PCT = 5.0  # of the step: a wait below it gates nothing worth naming
MOST = 0.6  # a rank gating fewer of the steps than this is no straggler: the last changes
_PHASE_WORDS = {
    "data": "data loading",
    "forward": "forward pass",
    "backward": "backward pass",
    "optimizer": "optimizer step",
    "other": "work after its backward pass",
}
_CAUSE_WORDS = {
    "data": "its data loading",
    "compute": "its compute",
    "host": "its host work (outside compute and data loading)",
    "communication": "communication",
}


@dataclass
class CriticalPath:
    """Over the steps every rank traced: who gates them, where, and why."""

    steps: int  # steps compared
    by: str  # "collectives" (the least time in them) or "step time" (no collectives)
    gating_rank: int  # the rank that gates the most steps
    gated_steps: int  # how many of them it gates
    cause: str  # CAUSES: why it is slow, against the other ranks' median
    phase: str  # PHASES: the phase of its step that is longer than the others'
    excess_ms: dict[str, float]  # per cause, its median excess over the others' median (ms)
    phase_excess_ms: dict[str, float]  # per phase, the same
    # median per step of how long the other ranks wait for it in collectives (by "step time":
    # how much longer its steps are than theirs)
    wait_ms: float
    step_ms: float  # median step time (the gating rank's)
    # its median gated step, as a chain of its phases: (phase, ms), in order; and the exposed
    # collectives' time inside them
    chain: list[tuple[str, float]] = field(default_factory=list)
    chain_exposed_ms: float = 0.0
    gates: list[tuple[int, int]] = field(default_factory=list)  # (rank, steps it gates), top few

    def notable(self) -> bool:
        """One rank gates most steps, and the others lose to it a share of the step worth
        naming."""
        if self.gated_steps < MOST * self.steps:
            return False
        return 100.0 * self.wait_ms / max(self.step_ms, 1e-9) >= NOTABLE_PCT

    def sentence(self) -> str:
        if self.gated_steps < MOST * self.steps:
            gates = ", ".join(f"rank {rank} in {count}" for rank, count in self.gates)
            return (
                f"no one rank holds the others back: the last to arrive changes from step to step "
                f"({gates} of {self.steps} steps)"
            )
        if not self.notable():
            said = (
                f"they wait {self.wait_ms:.1f} ms per step for the last to arrive"
                if self.by == "collectives"
                else f"the longest steps are {self.wait_ms:.1f} ms longer than the others'"
            )
            return f"no rank holds the others back: {said} ({self.steps} steps compared)"
        lost = (
            f"the others wait {self.wait_ms:.1f} ms per step for it"
            if self.by == "collectives"
            else f"its steps are {self.wait_ms:.1f} ms longer (not every rank's trace has collectives there)"
        )
        return (
            f"rank {self.gating_rank} gates {self.gated_steps} of {self.steps} steps: its "
            f"{_PHASE_WORDS[self.phase]} is {self.phase_excess_ms.get(self.phase, 0.0):.1f} ms longer than "
            f"the other ranks' and it is slow in {self.why()}; {lost}"
        )

    def why(self) -> str:
        """'its data loading (+15.1 ms per step)', or communication's own words."""
        if self.cause == "communication":
            return "communication (its own work explains less than half of the others' wait)"
        return f"{_CAUSE_WORDS[self.cause]} (+{self.excess_ms.get(self.cause, 0.0):.1f} ms per step)"

    def cause_text(self) -> str:
        """'its traced steps show why: its data loading (+15.1 ms per step, in its data)'."""
        if self.cause == "communication":
            return f"its traced steps show why: {self.why()}"
        return (
            f"its traced steps show why: {_CAUSE_WORDS[self.cause]} "
            f"(+{self.excess_ms.get(self.cause, 0.0):.1f} ms per step against the others' median"
            + (f", in its {_PHASE_WORDS[self.phase]})" if self.phase != "data" else ")")
        )

    def chain_text(self) -> str:
        """'rank 3: data 0.4 ms -> forward 12.1 ms -> ...; collectives exposed inside: 2 ms'."""
        phases = " -> ".join(f"{phase} {ms:.3g} ms" for phase, ms in self.chain)
        return (
            f"rank {self.gating_rank}: {phases}; collectives exposed inside: {self.chain_exposed_ms:.3g} ms"
        )
