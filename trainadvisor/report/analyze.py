"""What `analyze` prints: a block per trace (a few traces), or the rank table (many ranks),
then one line per finding and the notes, wrapped to a terminal's width."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from trainadvisor._serial import from_plain
from trainadvisor.analyze.rank_overview import RankOverview
from trainadvisor.analyze.rank_table import RankTable, table_lines
from trainadvisor.analyze.run.measures import split_text
from trainadvisor.analyze.run.summary import percentile
from trainadvisor.analyze.trace.facts import HOST_ITEM
from trainadvisor.analyze.trace.phases import job_from_collectives
from trainadvisor.records import AnalyzeReport
from trainadvisor.report.render import LABELS, _wrap
from trainadvisor.report.utilization import flops

BLOCKS_UP_TO = 3  # traces shown one block each; more are shown a line each
LINES_UP_TO = 12
_SYNC_NAMES = {"stream_sync": "stream", "device_sync": "device", "item": ".item()", "copy_sync": "in copies"}


def _header(a: Any) -> str:
    rank = f" (rank {a.rank} of {a.world_size})" if a.rank is not None else ""
    how = "" if a.steps_marked else " (found without markers)" if a.steps_found else " (one window)"
    # the median, as report.md's "step time, median" row (a mean would move with one slow step)
    median_ms = percentile([s.dur_us / 1e3 for s in a.steps], 50) or 0.0
    return f"{Path(a.path).name}{rank}: {len(a.steps)} steps, {median_ms:.1f} ms/step median{how}"


def _facts(a: Any) -> list[str]:
    facts = []
    if a.gpu_busy_pct is not None:
        facts.append(f"GPU busy {a.gpu_busy_pct:.1f}%")
    if a.tensor_core_pct is not None:
        unknown = a.tensor_core_unknown_pct
        extra = f" ({unknown:.0f}% of matrix time of unknown precision)" if unknown else ""
        facts.append(f"Tensor Core kernel time {a.tensor_core_pct:.1f}%{extra}")
    if a.h2d_pageable or a.h2d_pinned or a.h2d_unknown:
        unknown_copies = f" / {a.h2d_unknown} of unknown kind" if a.h2d_unknown else ""
        facts.append(f"H2D copies {a.h2d_pageable} pageable / {a.h2d_pinned} pinned{unknown_copies}")
    syncs = {kind: count for kind, count in a.syncs.items() if kind != HOST_ITEM}
    if syncs:
        facts.append("syncs " + ", ".join(f"{v} {_SYNC_NAMES.get(k, k)}" for k, v in sorted(syncs.items())))
    if a.syncs.get(HOST_ITEM):
        facts.append(f"{a.syncs[HOST_ITEM]} .item() that waited for no device")
    if a.allocator_calls:
        facts.append(f"{a.allocator_calls} device malloc/free calls in the steps")
    if a.graph_launches:
        facts.append(f"{a.graph_launches} graph launches ({a.graph_kernels} kernels)")
    if a.peak_reserved_bytes:
        facts.append(f"peak reserved {a.peak_reserved_bytes / 2**30:.2f} GiB")
    return facts


def _utilization(a: Any) -> list[str]:
    """MFU and the FLOPs it comes from (`analyze.trace.trace_flops`), then the peak's source."""
    use = a.utilization
    if use is None:
        return []
    if use.flops_per_step is None:
        return _wrap(f"  FLOPs {use.status}")
    unit = "step" if a.steps_found else "window"
    counted = f"{flops(use.flops_per_step)}/{unit} from the {a.flops_source}"
    if use.achieved_tflops is not None:
        counted += f", {use.achieved_tflops:.3g} TFLOP/s"
    if use.mfu_pct is None or use.peak_tflops is None:
        return _wrap(f"  {counted}; {use.status}")
    peak = f"{use.peak_tflops:.4g} TFLOP/s, the {use.peak_device} {use.peak_dtype} peak"
    return _wrap(f"  {use.label} {use.mfu_pct:.1f}% of {peak} ({counted})") + _wrap(
        f"  peak ({use.peak_how}): {use.peak_source}"
    )


def _block(a: Any) -> list[str]:
    lines = [_header(a)]
    parts = ", ".join(f"{LABELS[k]} {v:.1f}%" for k, v in a.breakdown_pct.items() if v >= 0.05)
    lines += _wrap(f"  {parts}")
    facts = _facts(a)
    if facts:
        lines += _wrap("  " + "; ".join(facts))
    return lines + _collectives(a) + _utilization(a)


def _collectives(a: Any) -> list[str]:
    """'collectives per step: all_reduce 15.6 ms (13.1 ms exposed), broadcast 0.04 ms (...)'."""
    found = getattr(a, "collectives", None) or {}
    if not found:
        return []
    said = ", ".join(
        f"{kind} {ms:.3g} ms ({exposed:.3g} ms exposed)"
        for kind, (ms, exposed) in sorted(found.items(), key=lambda kv: -kv[1][0])
    )
    overlap = a.communication_overlap_pct
    hidden = f"; {overlap:.0f}% of it overlapped with compute" if overlap is not None else ""
    lines = _wrap(f"  collectives per {'step' if a.steps_found else 'window'}: {said}{hidden}")
    c = getattr(a, "communication", None)
    if c is not None:
        if (job := job_from_collectives(c, a.world_size)) is not None:
            lines += _wrap(f"    parallel: {job}")
        efficiency = c.overlap_efficiency_pct
        lines += _wrap(
            f"    {c.exposed_ms_per_step:.3g} ms exposed of {c.ms_per_step:.3g} ms ({c.source})"
            + (f", overlap efficiency {efficiency:.0f}% (torchtitan's)" if efficiency is not None else "")
        )
        for title, split in (("by phase", c.by_phase), ("by process group", c.by_group)):
            if split:
                lines += _wrap(f"    {title}: {split_text(split)}")
    return lines


def _ranks(plain: dict[str, Any]) -> list[str]:
    table: RankTable = from_plain(RankTable, plain)
    path = table.critical
    said = [f"critical path: {path.sentence()}"] if path is not None else []
    said += [f"  {path.chain_text()}"] if path is not None and path.notable() else []
    critical = [line for text in said for line in _wrap(f"  {text}")]
    if table.overview is None:
        return [f"{len(table.rows)} ranks, per step in ms:", *table_lines(table), *critical]
    return _overview(table, table.overview) + critical


def _overview(table: RankTable, o: RankOverview) -> list[str]:
    """Many ranks: their distribution, the worst and best, the wait in collectives, groups."""
    lines = [f"{len(table.rows)} ranks, per step in ms (every rank's row is in report.json):"]
    lines.append("            step  compute  comm.   wait   data  overlap")
    for d in o.distribution:
        overlap = f"{d.overlap_pct:7.0f}%" if d.overlap_pct is not None else "     n/a"
        lines.append(
            f"  {d.label:>6} {d.step_ms:7.1f} {d.compute_ms:8.1f} {d.communication_ms:6.1f} "
            f"{d.wait_ms:6.1f} {d.data_ms:6.1f} {overlap}"
        )
    by_rank = {r.rank: r for r in table.rows}
    by_comm = o.key == "communication"
    for title, ranks in (
        (
            "worst: "
            + ("the others wait for them (least time in collectives)" if by_comm else "the longest steps"),
            o.worst,
        ),
        ("best: " + ("the most time waiting in collectives" if by_comm else "the shortest steps"), o.best),
    ):
        if ranks:
            lines += [f"  {title}", *table_lines(replace(table, rows=[by_rank[r] for r in ranks]))]
    if o.collective_wait_ms is not None:
        w = o.collective_wait_ms
        lines += _wrap(
            f"  collectives: the ranks wait {w['median']:.1f} ms per step for the last to arrive at "
            f"the median, {w['p90']:.1f} ms at p90, {w['max']:.1f} ms at most"
        )
    lines.append(
        f"  groups of alike ranks ({'time in collectives' if by_comm else 'step time'} and findings):"
    )
    for g in o.groups:
        key = "comm." if by_comm else "step"
        found = "; " + ", ".join(g.findings) if g.findings else ""
        lines += _wrap(
            f"    {g.label} ({len(g.ranks)}): {key} {g.key_ms_min:.1f}-{g.key_ms_max:.1f} ms, step "
            f"{g.step_ms_min:.1f}-{g.step_ms_max:.1f} ms{found}"
        )
    if o.groups_left:
        lines.append(f"    ... and {o.groups_left} more groups ({o.ranks_left} ranks)")
    return lines


def analysis_summary(report: AnalyzeReport, analyses: list[Any], out_dir: Path) -> str:
    """The diagnosis `analyze` prints."""
    lines: list[str] = []
    if len(analyses) <= BLOCKS_UP_TO:
        for a in analyses:
            lines += _block(a)
    elif report.ranks:
        lines += _ranks(report.ranks)
    else:
        lines += [_header(a) for a in analyses[:LINES_UP_TO]]
        if len(analyses) > LINES_UP_TO:
            lines.append(f"... and {len(analyses) - LINES_UP_TO} more traces (report.md lists them all)")
    if report.ranks and len(analyses) <= BLOCKS_UP_TO:
        lines += _ranks(report.ranks)
    for finding in report.findings:
        lines += _wrap(f"  [{finding.severity}] {finding.rule}: {finding.message}")
    for note in report.notes:
        lines += _wrap(f"  note: {note}")
    lines.append(f"  report: {out_dir / 'report.html'}")
    return "\n".join(lines)
