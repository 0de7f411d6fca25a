"""How one step's peak memory and its parts read in a report (`records.memory.Memory`). Pure."""

from __future__ import annotations

from trainadvisor.records import Run

PARTS = (
    ("parameters", "parameters"), ("gradients", "gradients"), ("optimizer_state", "optimizer state"),
    ("activations", "activations"), ("other", "other"),
)  # fmt: skip


def size(value: float) -> str:
    """Bytes in the unit torch's allocator prints: 6.47 MB, 10.05 GB (10^3 steps)."""
    for scale, unit in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} B"


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
