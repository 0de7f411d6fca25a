"""The records saved beside a run: a job's critical path across ranks in words (`CriticalPath`),
and a step's memory and compute figures (`Memory`, `PeakSite`, `Utilization`) kept whole through
report.json's serialiser."""

from __future__ import annotations

from trainadvisor import _serial
from trainadvisor.records.across_ranks import CriticalPath
from trainadvisor.records.compute import Utilization
from trainadvisor.records.memory import Memory, PeakSite


def _path(gated_steps: int, wait_ms: float, cause: str = "data", phase: str = "data") -> CriticalPath:
    """Rank 3 of a job whose steps take 100 ms, gating `gated_steps` of 10."""
    return CriticalPath(
        10, "collectives", 3, gated_steps, cause, phase, {"data": 15.06, "compute": 2.0},
        {"data": 14.9, "forward": 1.0}, wait_ms, 100.0, [("data", 15.2), ("forward", 40.0)], 2.0,
        [(3, gated_steps), (1, 10 - gated_steps)],
    )  # fmt: skip


def test_a_rank_that_gates_most_steps_by_a_share_worth_naming_is_named_with_its_cause() -> None:
    path = _path(8, 12.0)
    assert path.notable()
    assert path.sentence() == (
        "rank 3 gates 8 of 10 steps: its data loading is 14.9 ms longer than the other ranks' and it is "
        "slow in its data loading (+15.1 ms per step); the others wait 12.0 ms per step for it"
    )
    assert (
        path.cause_text()
        == "its traced steps show why: its data loading (+15.1 ms per step against the others' median)"
    )
    assert path.chain_text() == "rank 3: data 15.2 ms -> forward 40 ms; collectives exposed inside: 2 ms"


def test_a_rank_gating_fewer_than_six_steps_in_ten_is_no_straggler() -> None:
    path = _path(5, 30.0)  # 5 < 0.6 x 10, however long the wait
    assert not path.notable()
    assert path.sentence() == (
        "no one rank holds the others back: the last to arrive changes from step to step "
        "(rank 3 in 5, rank 1 in 5 of 10 steps)"
    )


def test_a_wait_under_five_percent_of_the_step_is_said_but_not_notable() -> None:
    assert _path(6, 5.0).notable() and not _path(6, 4.9).notable()  # of a 100 ms step


def test_communication_as_the_cause_is_said_in_its_own_words() -> None:
    path = _path(9, 20.0, cause="communication", phase="backward")
    assert path.why() == "communication (its own work explains less than half of the others' wait)"
    assert path.cause_text() == f"its traced steps show why: {path.why()}"


def test_memory_and_compute_figures_are_kept_whole_through_the_serialiser() -> None:
    memory = Memory(
        "measured", 6_890_000, {"parameters": 2_140_000, "activations": 410_000}, "allocator",
        peak_sites=[PeakSite("parameters", 2_140_000, 6)],
    )  # fmt: skip
    utilization = Utilization(
        "measured", 1.2e9, 30.924, 46.225, 66.9, "fp32", "H100", "datasheet", "datasheet"
    )
    plain = _serial.to_plain({"memory": memory, "utilization": utilization})
    assert plain["memory"]["peak_sites"] == [{"site": "parameters", "bytes": 2_140_000, "tensors": 6}]
    assert plain["utilization"]["mfu_pct"] == 46.225 and plain["utilization"]["peak_dtype"] == "fp32"
    assert _serial.from_plain(Memory, plain["memory"]) == memory
    assert _serial.from_plain(Utilization, plain["utilization"]) == utilization
