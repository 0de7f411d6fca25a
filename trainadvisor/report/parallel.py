"""How a run's data parallelism reads in a report, in one line: the wrapper, over how many
processes, and the settings that cost every step (`training.parallel` recorded them). Pure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainadvisor.records import Run


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
