"""A run's step memory from what its child recorded (`memory.step`), its budget, and the named
measurements rules read of it. Pure: a report re-rendered gives the same."""

from __future__ import annotations

from typing import Any

from trainadvisor.records.memory import Memory, PeakSite


def step_memory(runtime: dict[str, Any]) -> Memory | None:
    """None where the run recorded nothing of it (saved before it was measured). On a GPU the
    budget is what the allocator may use (`cuda_memory.limit_bytes`) until `--memory-budget`
    replaces it."""
    facts = runtime.get("memory")
    if not facts:
        return None
    memory = Memory(
        status=facts.get("status", "not measured"),
        peak_bytes=facts.get("peak_bytes"),
        breakdown=dict(facts.get("breakdown") or {}),
        peak_source=facts.get("peak_source", ""),
        note=facts.get("note", ""),
        timeline_bytes=[int(b) for b in facts.get("timeline_bytes") or []],
        peak_sites=[
            PeakSite(str(s["site"]), int(s["bytes"]), int(s["tensors"]))
            for s in facts.get("peak_sites") or []
        ],
    )
    limit = (runtime.get("cuda_memory") or {}).get("limit_bytes")
    if limit:
        source = (runtime.get("cuda_memory") or {}).get("limit_source") or "what the allocator may use"
        memory.budget_bytes, memory.budget_source = int(limit), str(source)
    return memory


def memory_measurements(memory: Memory | None) -> dict[str, Any]:
    """`step_peak_bytes`, each part's bytes and share (`activations_bytes`, `activations_pct`,
    ...), and against the budget `memory_budget_bytes` and `budget_used_pct`."""
    if memory is None or memory.peak_bytes is None:
        return {}
    peak = memory.peak_bytes
    table: dict[str, Any] = {"step_peak_bytes": peak}
    for part, size in memory.breakdown.items():
        table[f"{part}_bytes"] = size
        if peak:
            table[f"{part}_pct"] = 100.0 * size / peak
    if memory.budget_bytes:
        table["memory_budget_bytes"] = memory.budget_bytes
        table["budget_used_pct"] = 100.0 * peak / memory.budget_bytes
    return table
