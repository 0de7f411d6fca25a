"""How one step's peak memory and its parts read in a report (`records.memory.Memory`). Pure."""

from __future__ import annotations

from trainadvisor.records import Report, Run, fix_outcomes_of
from trainadvisor.units import scaled

PARTS = (
    ("parameters", "parameters"), ("gradients", "gradients"), ("optimizer_state", "optimizer state"),
    ("gathered_parameters", "gathered parameters (FSDP)"), ("activations", "activations"), ("other", "other"),
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


def peak_sites_text(run: Run, shown: int = 5) -> str:
    """'train.py:42 41.9 MB (24 tensors), optimizer state 12.6 MB (48 tensors), ...': what
    held the step's peak, by the line of the user's code that made it; '' when not measured."""
    memory = run.memory
    if memory is None or not memory.peak_sites:
        return ""
    return ", ".join(
        f"{s.site} {size(s.bytes)} ({s.tensors} tensor{'s' if s.tensors != 1 else ''})"
        for s in memory.peak_sites[:shown]
    )


def step_chart(run: Run, width: float = 560.0, height: float = 80.0) -> dict[str, str]:
    """The step's live bytes over its operators as polyline points, the peak's place (`x`,
    `y`) and the scale's top; {} when the step's memory was not followed."""
    memory = run.memory
    series = memory.timeline_bytes if memory is not None else []
    top = max(series, default=0)
    if len(series) < 2 or not top:
        return {}
    step_x = width / (len(series) - 1)
    points = " ".join(f"{i * step_x:.1f},{height - height * b / top:.1f}" for i, b in enumerate(series))
    at = series.index(top)
    return {
        "points": points,
        "x": f"{at * step_x:.1f}",
        "y": "0",
        "top": size(top),
        "ops_pct": f"{100 * at / (len(series) - 1):.0f}",
    }


def memory_fit(report: Report) -> str | None:
    """Where the baseline's step does not fit its budget: the fastest memory fix measured that
    fits it, with its peak and its cost in speed ('checkpoint each of the 8 Block blocks of
    model.blocks fits the budget of 30 MB: peak 21 MB, 1.31x slower per step'), or that none
    did; None where the step fits or nothing was measured."""
    base = report.baseline
    memory = base.memory if base is not None else None
    if memory is None or memory.fits is not False or memory.budget_bytes is None:
        return None
    budget = memory.budget_bytes
    tried = [o for o in fix_outcomes_of(report) if o.trials and o.fix in MEMORY_FIXES]
    fitting = [
        o for o in tried if o.status == "recommended" and o.peak_bytes is not None and o.peak_bytes <= budget
    ]
    if not fitting:
        said = ", ".join(o.fix for o in tried) or "no memory fix"
        return f"nothing measured fits the budget of {size(budget)} ({said} tried)"
    best = max(fitting, key=lambda o: o.gain or 0.0)
    cost = ""
    if best.gain:
        cost = (
            f", {1 / best.gain:.2f}x slower per step"
            if best.gain < 1
            else f", {best.gain:.2f}x faster per step"
        )
    name, peak = best.chosen.split(":", 1)[0], size(best.peak_bytes or 0)
    return f"{name} fits the budget of {size(budget)}: peak {peak}{cost}"


MEMORY_FIXES = ("activation-checkpointing", "grad-accumulation")
