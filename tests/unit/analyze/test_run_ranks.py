"""Per-rank measurements of a torchrun run (`analyze.run.ranks`), on ranks built by hand: each rank's
timed steps, memory and trace summarised, the straggler and the skew it causes, the peaks' spread,
the rank that died of out-of-memory, and the rank that waits least in its collectives."""

from __future__ import annotations

from typing import Any

from trainadvisor.analyze.run.ranks import least_waiting, rank_measurements, rank_oom, rank_stats
from trainadvisor.analyze.trace.phases import DEVICE_SOURCE, HOST_SOURCE
from trainadvisor.analyze.trace.trace_records import CommAttribution, TraceAnalysis
from trainadvisor.records import RankStats, RawRun, RunStatus, StepRecord

GiB = 2**30


def _rank(
    rank: int | None,
    step_ms: list[float],
    pre_backward_ms: list[float | None],
    data_ms: float = 2.0,
    runtime: dict[str, Any] | None = None,
    status: RunStatus = "window_complete",
) -> RawRun:
    """A rank's timed steps, then one traced step of 1,000 ms (its profiler's overhead: never
    counted)."""
    steps = [
        StepRecord(i, 0.0, ms, data_ms, pre_backward_ms=pre)
        for i, (ms, pre) in enumerate(zip(step_ms, pre_backward_ms))
    ]
    steps.append(StepRecord(len(steps), 0.0, 1000.0, 500.0, profiled=True, pre_backward_ms=900.0))
    return RawRun(
        f"rank{rank}",
        status,
        0,
        None,
        5,
        len(step_ms),
        1,
        20,
        steps,
        [],
        None,
        runtime=runtime or {},
        rank=rank,
    )


def _job(*ranks: RawRun) -> RawRun:
    return RawRun("baseline", "window_complete", 0, None, 5, 4, 1, 20, [], [], None, ranks=list(ranks))


def _fsdp(peak: int) -> dict[str, Any]:
    return {"memory": {"peak_bytes": peak, "breakdown": {"parameters": 400, "gathered_parameters": 300}}}


# rank 1 spends 70 ms before its backward pass, the others 40 and 44: the straggler
STRAGGLER = _job(
    _rank(0, [90.0, 110.0, 100.0, 100.0], [38.0, 42.0, 40.0, 40.0], runtime=_fsdp(1000)),
    _rank(1, [110.0, 110.0, 110.0, 110.0], [60.0, 80.0, 70.0, 70.0], data_ms=5.0, runtime=_fsdp(1250)),
    _rank(2, [90.0, 90.0, 90.0, 90.0], [44.0, 44.0, 44.0, 44.0], runtime=_fsdp(800)),
)


def _trace(rank: int, kernels: int, communication: CommAttribution | None, **fields: Any) -> TraceAnalysis:
    return TraceAnalysis(
        path=f"rank{rank}.json", events=100, rank=rank, world_size=3, gpu_name=None, gpu_memory_bytes=None,
        steps_marked=True, steps=[], breakdown_pct=fields.pop("breakdown_pct", {}),
        step_time_ms_mean=fields.pop("step_time_ms_mean", None), gpu_busy_pct=None, tensor_core_pct=None,
        kernels=kernels, short_kernels=0, kernel_us_median=None, launch_delay_us_median=None, h2d_pageable=0,
        h2d_pinned=0, h2d_unknown=0, h2d_pageable_bytes=0, syncs={}, peak_allocated_bytes=None,
        peak_reserved_bytes=None, communication=communication, **fields,
    )  # fmt: skip


def _stats(rank: int, collective_ms: float | None, communication_pct: float | None = None) -> RankStats:
    return RankStats(
        rank, "window_complete", None, 4, 100.0, 40.0, 2.0, communication_pct=communication_pct,
        communication_overlap_pct=50.0 + rank, collective_ms_per_step=collective_ms,
    )  # fmt: skip


def test_each_ranks_timed_steps_are_averaged_without_its_traced_step() -> None:
    stats = rank_stats(STRAGGLER)
    assert [
        (s.rank, s.steps, s.step_time_ms_mean, s.pre_backward_ms_mean, s.data_wait_ms_mean) for s in stats
    ] == [
        (0, 4, 100.0, 40.0, 2.0),
        (1, 4, 110.0, 70.0, 5.0),
        (2, 4, 90.0, 44.0, 2.0),
    ]


def test_steps_that_reached_no_backward_are_left_out_of_the_pre_backward_mean() -> None:
    raw = _job(_rank(3, [100.0, 100.0, 100.0], [30.0, None, 60.0], status="script_failed"))
    (stats,) = rank_stats(raw)
    assert (stats.rank, stats.status, stats.steps, stats.pre_backward_ms_mean) == (
        3,
        "script_failed",
        3,
        45.0,
    )


def test_a_rank_without_timed_steps_has_no_means() -> None:
    (stats,) = rank_stats(_job(_rank(0, [], [])))
    assert (stats.steps, stats.step_time_ms_mean, stats.pre_backward_ms_mean, stats.data_wait_ms_mean) == (
        0, None, None, None,
    )  # fmt: skip


def test_under_fsdp_a_ranks_sharded_and_gathered_parameters_are_kept_beside_its_peak() -> None:
    fsdp, plain = rank_stats(
        _job(
            _rank(0, [100.0], [40.0], runtime=_fsdp(1000)),
            _rank(
                1, [100.0], [40.0], runtime={"memory": {"peak_bytes": 900, "breakdown": {"parameters": 400}}}
            ),
        )
    )
    assert (fsdp.peak_bytes, fsdp.sharded_parameter_bytes, fsdp.gathered_parameter_bytes) == (1000, 400, 300)
    # without gathered parameters the parameters are whole, not a shard
    assert (plain.peak_bytes, plain.sharded_parameter_bytes, plain.gathered_parameter_bytes) == (
        900,
        None,
        None,
    )


def test_without_traces_a_rank_has_no_communication_figures() -> None:
    stats = rank_stats(STRAGGLER)[0]
    assert (stats.communication_pct, stats.communication_overlap_pct, stats.collective_ms_per_step) == (
        None, None, None,
    )  # fmt: skip
    assert (stats.collectives_by_kind, stats.collectives_by_phase, stats.collectives_by_group) == ({}, {}, {})


def test_nccl_kernels_take_the_breakdowns_share_and_gloo_collectives_their_own() -> None:
    nccl = CommAttribution(
        DEVICE_SOURCE, 12.0, 3.0, 75.0, by_kind={"all_reduce": [12.0, 3.0]},
        by_phase={"backward": [12.0, 3.0]}, by_group={"default_pg, 3 ranks": [12.0, 3.0]},
    )  # fmt: skip
    gloo = CommAttribution(HOST_SOURCE, 20.0, 8.0, 40.0)
    traces = {
        0: _trace(0, 50, nccl, breakdown_pct={"communication": 15.0}, communication_overlap_pct=60.0),
        # a host backend's share is its collectives' ms over the step: 20 of 80 ms; its overlap is
        # the collectives' own, not the kernels' figure
        1: _trace(1, 50, gloo, step_time_ms_mean=80.0, communication_overlap_pct=99.0),
        # no kernels and no collectives: a host trace with nothing to share
        2: _trace(2, 0, None, breakdown_pct={"communication": 5.0}, communication_overlap_pct=33.0),
    }
    device, host, empty = rank_stats(STRAGGLER, traces)
    assert (device.communication_pct, device.communication_overlap_pct, device.overlap_efficiency_pct) == (
        15.0, 60.0, 75.0,
    )  # fmt: skip
    assert (device.collective_ms_per_step, device.collective_exposed_ms_per_step) == (12.0, 3.0)
    assert device.collectives_by_kind == {"all_reduce": [12.0, 3.0]}
    assert device.collectives_by_phase == {"backward": [12.0, 3.0]}
    assert device.collectives_by_group == {"default_pg, 3 ranks": [12.0, 3.0]}
    assert (host.communication_pct, host.communication_overlap_pct, host.collective_ms_per_step) == (
        25.0, 40.0, 20.0,
    )  # fmt: skip
    assert (empty.communication_pct, empty.communication_overlap_pct, empty.collective_ms_per_step) == (
        None, 33.0, None,
    )  # fmt: skip


def test_the_straggler_is_measured_against_the_other_ranks_median() -> None:
    table = rank_measurements(rank_stats(STRAGGLER))
    assert table == {
        "ranks": 3,
        "rank_peak_bytes_max": 1250,
        "rank_peak_max_rank": 1,
        "rank_peak_imbalance_pct": 56.25,  # (1,250 - 800) / 800
        "slowest_rank": 1,
        "slowest_rank_pre_backward_ms": 70.0,
        "others_pre_backward_ms": 42.0,  # the median of 40 and 44
        "rank_skew_pct": 28.0,  # (70 - 42) / 100 ms, the ranks' mean step
        "rank_step_time_ms_max": 110.0,
        "rank_step_time_ms_min": 90.0,
        "straggler_evidence": (
            "it spends 70.0 ms per step before its backward pass against 42.0 ms on the other ranks, "
            "which wait for it in the gradient all-reduce (28% of every step)"
        ),
    }


def test_with_one_rank_measured_only_the_count_and_the_peaks_are_given() -> None:
    raw = _job(
        _rank(0, [100.0], [40.0], runtime=_fsdp(1000)),
        _rank(1, [100.0], [None], runtime=_fsdp(1500)),
    )
    assert rank_measurements(rank_stats(raw)) == {
        "ranks": 2,
        "rank_peak_bytes_max": 1500,
        "rank_peak_max_rank": 1,
        "rank_peak_imbalance_pct": 50.0,
    }
    assert rank_measurements([]) == {}


def test_the_share_of_communication_is_the_one_the_least_waiting_rank_sees() -> None:
    stats = [_stats(0, 30.0, 30.0), _stats(1, 5.0, 5.0), _stats(2, 28.0, 28.0)]
    assert least_waiting(stats) is stats[1]
    table = rank_measurements(stats)
    assert (table["communication_pct"], table["communication_overlap_pct"]) == (5.0, 51.0)


def test_a_rank_whose_trace_shows_no_collectives_was_cut_short_so_none_is_least_waiting() -> None:
    stats = [_stats(0, 30.0, 30.0), _stats(1, 0.0, 0.0), _stats(2, 28.0, 28.0)]
    assert least_waiting(stats) is None
    assert "communication_pct" not in rank_measurements(stats)
    assert least_waiting([_stats(0, 30.0)]) is None
    # the least waiting rank's share unknown: no share is given
    assert "communication_pct" not in rank_measurements([_stats(0, 30.0, 30.0), _stats(1, 5.0, None)])


def _oom(request_gib: int) -> dict[str, Any]:
    return {
        "kind": "cuda", "request_bytes": request_gib * GiB, "live_bytes": 30 * GiB, "limit_bytes": 31 * GiB,
        "limit_source": "device total",
    }  # fmt: skip


def test_the_first_rank_that_died_of_out_of_memory_is_named_with_its_request() -> None:
    raw = _job(
        _rank(0, [100.0], [40.0]),
        _rank(2, [100.0], [40.0], runtime={"oom": _oom(2)}, status="script_failed"),
        _rank(3, [100.0], [40.0], runtime={"oom": _oom(4)}, status="script_failed"),
    )
    table = rank_oom(raw)
    assert (table["oom_rank"], table["oom_request_bytes"], table["oom_memory"]) == (2, 2 * GiB, "GPU memory")
    assert table["oom_summary"] == (
        "on rank 2, it asked for 2.00 GiB more with 30.00 GiB already allocated, of the 31.00 GiB it "
        "may use (device total)"
    )


def test_a_job_without_out_of_memory_has_no_oom_measurements() -> None:
    assert rank_oom(STRAGGLER) == {}
    assert rank_oom(_job(_rank(0, [100.0], [40.0], runtime={"oom": {}}))) == {}
