"""How one step's peak memory and its parts read in a report (`records.memory.Memory`). Pure."""

from __future__ import annotations

from trainadvisor.records import Run
from trainadvisor.report.utilization import scaled

PARTS = (
    ("parameters", "parameters"), ("gradients", "gradients"), ("optimizer_state", "optimizer state"),
    ("activations", "activations"), ("other", "other"),
)  # fmt: skip


def size(value: float) -> str:
    """Bytes in decimal units, as torch's allocator and the cards' datasheets write them."""
    return scaled(value, "B", "kMGT")


def memory_cell(run: Run) -> str:
    """'6.47 MB: parameters 17%, gradients 17%, optimizer state 34%, activations 6%, other 27%'
    (and the budget), or why it was not measured."""
    memory = run.memory
    if memory is None:
        return "not measured"
    if memory.peak_bytes is None:
        return memory.status
    peak = memory.peak_bytes
    parts = ", ".join(
        f"{words} {100.0 * memory.breakdown[key] / peak:.0f}%"
        for key, words in PARTS
        if key in memory.breakdown and peak
    )
    text = f"{size(peak)}: {parts}"
    if memory.budget_bytes:
        fits = "fits" if memory.fits else "DOES NOT FIT"
        text += f"; {fits} the budget of {size(memory.budget_bytes)} ({memory.budget_source})"
    return text


def memory_title(run: Run) -> str:
    memory = run.memory
    if memory is None or memory.peak_bytes is None:
        return ""
    return f"peak: {memory.peak_source}" + (f"; {memory.note}" if memory.note else "")
