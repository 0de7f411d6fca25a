"""How a run's data parallelism reads in a report, in one line: the wrapper, over how many
processes, and the settings that cost every step (`training.parallel` recorded them). Pure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainadvisor.analyze.run.measures import split_text
from trainadvisor.analyze.run.ranks import least_waiting
from trainadvisor.records import Run
from trainadvisor.report.memory import size


def parallelism(run: Run) -> str | None:
    """'DDP over 2 processes: buckets of 0.05 MiB, a search for unused parameters each step
    (none went unused), gradient_as_bucket_view off; built at train.py:79', or None."""
    facts = run.raw.runtime
    if facts.get("fsdp_units"):
        return _fsdp(facts)
    world = facts.get("ddp_world_size")
    if not facts.get("ddp_modules") or world is None:
        return None
    cap = facts.get("ddp_bucket_cap_mb")
    said = [f"buckets of {float(cap):.3g} MiB"] if cap is not None else []
    if facts.get("ddp_find_unused_parameters"):
        unused = facts.get("ddp_unused_parameter_bytes")
        found = " (none went unused)" if unused == 0 else f" ({unused} bytes went unused)" if unused else ""
        said.append(f"a search for unused parameters each step{found}")
    if facts.get("ddp_gradient_as_bucket_view") is False:
        said.append("gradient_as_bucket_view off")
    if facts.get("ddp_static_graph"):
        said.append("static graph")
    site = str(facts.get("ddp_call_site") or "")
    where = f"; built at {Path(site).name}" if site and site != "unknown" else ""
    settings = f": {', '.join(said)}" if said else ""
    return f"DDP over {world} processes{settings}{where}"


def _fsdp(facts: dict[str, Any]) -> str:
    """'FSDP2 over 4 ranks: 9 units, 8 reshard after forward'."""
    world = facts.get("fsdp_world_size")
    over = f" over {world} ranks" if world else ""
    said = f"{facts['fsdp_units']} units"
    if facts.get("fsdp_version") == "FSDP2":
        said += f", {facts.get('fsdp_resharding_units', 0)} reshard after forward"
    return f"{facts.get('fsdp_version', 'FSDP')}{over}: {said}"


def communication(run: Run) -> list[str]:
    """Under torchrun, the collectives of the rank that waits least in them (the others' hold
    their wait for it): per step, exposed, overlap efficiency, by phase, kind and process group."""
    r = least_waiting(run.ranks)
    if r is None:
        return []
    efficiency = r.overlap_efficiency_pct
    lines = [
        f"collectives (rank {r.rank}, the one waiting least): {r.collective_ms_per_step:.3g} ms per "
        f"traced step, {r.collective_exposed_ms_per_step or 0.0:.3g} ms exposed"
        + (f", overlap efficiency {efficiency:.0f}% (torchtitan's)" if efficiency is not None else "")
    ]
    for title, split in (
        ("by phase", r.collectives_by_phase),
        ("by kind", r.collectives_by_kind),
        ("by process group", r.collectives_by_group),
    ):
        if split:
            lines.append(f"  {title}: {split_text(split)}")
    return lines


def rank_memory(run: Run) -> list[str]:
    """'memory per rank: peak 876-880 kB (rank 1 the largest, +0.5%); FSDP: 135 kB of
    parameters held sharded, 22 kB gathered at the peak (rank 0)'."""
    known = [r for r in run.ranks if r.peak_bytes]
    if len(known) < 2:
        return []
    high = max(known, key=lambda r: r.peak_bytes or 0)
    low = min(r.peak_bytes or 0 for r in known)
    spread = 100.0 * ((high.peak_bytes or 0) - low) / low
    text = (
        f"memory per rank: peak {size(low)}-{size(high.peak_bytes or 0)} (rank {high.rank} the largest, "
        f"+{spread:.1f}%)"
        if size(low) != size(high.peak_bytes or 0)
        else f"memory per rank: peak {size(low)} on each rank (within {spread:.1f}%)"
    )
    if high.sharded_parameter_bytes is not None:
        text += (
            f"; FSDP on rank {high.rank}: {size(high.sharded_parameter_bytes)} of parameters held sharded, "
            f"{size(high.gathered_parameter_bytes or 0)} gathered at its peak"
        )
    return [text]


def critical(run: Run) -> list[str]:
    """'critical path: rank 2 gates 10 of 10 steps: ...', and its median step's chain."""
    path = run.critical_path
    if path is None:
        return []
    return [f"critical path: {path.sentence()}"] + ([f"  {path.chain_text()}"] if path.notable() else [])
