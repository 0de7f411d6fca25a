"""Rendering: report.json (the whole saved pipeline state, re-renderable), report.md (a
pull-request-sized summary), report.html (one self-contained file, pictures as inline SVG), and
the short terminal diagnosis. Pure: a Report in, text out."""

from __future__ import annotations

import functools
import json
import math
import os
import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import markupsafe
import msgspec

from trainadvisor import _serial
from trainadvisor.analyze.run.summary import BREAKDOWN_KEYS, NO_LOADER, OUTSIDE_CALL, window_samples
from trainadvisor.records import (
    SCHEMA_VERSION,
    AnalyzeReport,
    FixOutcome,
    GpuSample,
    HostSample,
    LossCheck,
    ProfileReport,
    Report,
    Run,
    after_of,
    fix_outcomes_of,
    schema,
    timed_steps,
)
from trainadvisor.records.energy import Energy
from trainadvisor.records.upgrade import upgraded
from trainadvisor.report import mdtext
from trainadvisor.report.memory import memory_cell, memory_fit, memory_title, peak_sites_text, step_chart
from trainadvisor.report.parallel import communication, critical, parallelism, rank_memory
from trainadvisor.report.utilization import flops_cell, mfu_cell, mfu_title, mfu_words

COLORS = {
    "data_wait": "#d9534f", "h2d_copy": "#f0ad4e", "compute": "#5b9bd5", "outside_call": "#b38bc9",
    "kernel": "#5b9bd5", "memcpy": "#f0ad4e", "memset": "#e8c36a", "communication": "#8e6bbf",
    "runtime": "#7fb77e", "other_host": "#9aa5b1", "idle": "#dddddd",
}  # fmt: skip
LABELS = {
    "data_wait": "data wait", "h2d_copy": "host-to-device copy", "compute": "compute & other",
    "outside_call": "outside the decorated function",
    "kernel": "GPU kernels", "memcpy": "memcpy", "memset": "memset", "communication": "communication",
    "runtime": "CUDA runtime", "other_host": "other host work", "idle": "idle",
}  # fmt: skip
UNKNOWN_COLOR = "#b8a99a"  # a part of the breakdown this version does not know


def label_of(key: str) -> str:
    """A part of the breakdown in words; one this version does not know (a newer version's
    report) by its own name, in words and nothing else (it is shown in Markdown and HTML)."""
    return LABELS.get(key) or " ".join(re.findall(r"[A-Za-z0-9]+", key)) or "other"


def headline(report: Report) -> str:
    """One sentence: what the fixes measured, and what held the loop back."""
    outcomes = fix_outcomes_of(report)
    text = _gain_sentence(report) if isinstance(report, ProfileReport) else ""
    top = report.findings[0] if report.findings else None
    if text and top is not None:  # the main bottleneck: the most severe finding
        text += f"; the bottleneck: {top.title[0].lower()}{top.title[1:]}"
    elif top is not None:
        text = f"{top.title} ({top.severity})"
        if outcomes:  # fixes were measured (not: --no-fix, a failed script, analyze)
            text += "; no fix was kept"
            recommended = [o.fix for o in outcomes if o.status == "recommended"]
            if recommended and memory_fit(report) is None:
                text += f"; recommended: {', '.join(recommended)}"
    elif not text:
        if report.baseline is None or not report.baseline.steps:
            return "Nothing was measured"
        text = "No bottleneck found by the rules in the profiled window"
    for outcome in outcomes:
        if outcome.status == "opportunity" and outcome.gain:
            text += (
                f"; opportunity: {outcome.gain:.2f}x {outcome.unit} with {_short(outcome.chosen)}, "
                f"which changes training ({outcome.fix})"
            )
    unsure = [o.fix for o in outcomes if o.status == "inconclusive"]
    if unsure:  # faster in fresh runs on a machine whose speed changed: neither kept nor rejected
        text += f"; inconclusive: {', '.join(unsure)} (measured faster, but not comparably: see its fix line)"
    fit = memory_fit(report)
    return f"{text}; memory: {fit}" if fit else text


def _gain_sentence(report: ProfileReport) -> str:
    """The confirmed gain of the kept fixes, or else the largest gain a trial measured that no
    confirmation run could check ("" when there is neither)."""
    kept = [o for o in report.fix_outcomes if o.status == "kept"]
    comparison = report.comparison
    if kept and comparison and comparison.speedup:
        text = (
            f"{comparison.speedup:.2f}x faster in {comparison.unit} (range {comparison.speedup_low:.2f}-"
            f"{comparison.speedup_high:.2f}x across windows) after " + ", ".join(o.fix for o in kept)
        )
        if comparison.unit == "samples/s" and report.baseline and report.after:
            text += (
                f" (in samples/s: the batch size changed; steps/s went from "
                f"{report.baseline.steps_per_s or 0:.1f} to {report.after.steps_per_s or 0:.1f})"
            )
        if comparison.cut:
            text += f", confirmed on what the script's length allowed ({comparison.timed_steps} timed steps)"
        return text
    unconfirmed = [o for o in report.fix_outcomes if o.status == "unconfirmed" and o.gain]
    if unconfirmed:
        best = max(unconfirmed, key=lambda o: o.gain or 0.0)
        return (
            f"{best.gain:.2f}x faster in {best.unit} in trial windows with {best.fix} "
            f"({_short(best.chosen)}), not confirmed in a fresh run"
        )
    return ""


def _short(chosen: str) -> str:
    """A setting in words without what follows its colon (the learning-rate rule of a batch size)."""
    return chosen.split(":", 1)[0]


def fix_line(outcome: FixOutcome) -> str:
    """A fix's outcome in one line, the same in the terminal, report.md and report.html: its
    status, the setting, why, and its own measured gain beside the combination's."""
    chosen = f" ({outcome.chosen})" if outcome.chosen else ""
    text = f"{outcome.status.replace('_', ' ')}{chosen}: {outcome.reason}"
    if outcome.status == "kept" and outcome.gain:
        low = f", range from {outcome.gain_low:.2f}x" if outcome.gain_low is not None else ""
        text += f"; its own trial: {outcome.gain:.2f}x {outcome.unit}{low}"
        if outcome.added_gain:
            text += f"; on top of the other kept fixes: {outcome.added_gain:.2f}x"
    return text


# NVML's energy counter moves about every 100 ms (seen on an H100): over a window shorter than
# COUNTER_WINDOW_S its figure is said to be that coarse.
COUNTER_STEP_S = 0.1
COUNTER_WINDOW_S = 5.0


def energy_cell(energy: Energy | None) -> str:
    """A run's energy in a report's table: per sample and per step, and how it was measured
    ("2.91 J/sample, 186 J/step (energy counter)"), or "not measured: why"."""
    if energy is None:
        return "n/a"
    if energy.energy_j is None or energy.j_per_step is None:
        return f"not measured: {energy.reason}"
    per_sample = f"{_joules(energy.j_per_sample)} J/sample, " if energy.j_per_sample is not None else ""
    gpus = f", {len(energy.devices)} GPUs" if len(energy.devices) > 1 else ""
    coarse = ""
    if energy.method == "energy counter" and 0 < energy.timed_s < COUNTER_WINDOW_S:
        # NVML's counter moves about every 100 ms: over a short window that is a visible share
        coarse = f"; over {energy.timed_s:.2g} s, good to about {100 * COUNTER_STEP_S / energy.timed_s:.0f}%"
    return f"{per_sample}{_joules(energy.j_per_step)} J/step ({energy.method}{gpus}{coarse})"


def energy_title(energy: Energy | None) -> str:
    """The total behind a run's energy cell: "1,863 J over 3.01 s of timed steps (GPU 0)"."""
    if energy is None or energy.energy_j is None:
        return ""
    gpus = ", ".join(energy.devices)
    return f"{_joules(energy.energy_j)} J over {energy.timed_s:.3g} s of timed steps ({gpus})"


def _joules(value: float) -> str:
    """Three significant figures, without an exponent: 1,863 / 12.4 / 2.91 / 0.0123."""
    if value <= 0:
        return "0"
    return f"{value:,.{max(0, 2 - math.floor(math.log10(value)))}f}"


def after_line(report: Report, settings: bool = True) -> str | None:
    """What the after run contained, in words, with each fix's settings unless `settings` is
    False (the terminal, whose fix lines give them); None without an after run."""
    if not isinstance(report, ProfileReport) or report.after is None:
        return None
    contains = report.comparison.contains if report.comparison else []
    if not contains or not settings:
        contains = [c.split(":", 1)[0] for c in contains] or [
            o.fix for o in report.fix_outcomes if o.status in ("kept", "unconfirmed")
        ]
    changed = "; ".join(contains) or "nothing"
    if not report.after.steps:
        return f"the after run ({changed}) timed no step"
    kept = any(o.status == "kept" for o in report.fix_outcomes)
    return f"the after run changed {changed} ({'kept' if kept else 'not kept'})"


# ---- pictures (geometry computed here, drawn by the template) ----


@dataclass
class Bar:
    x: float
    y: float
    width: float
    height: float
    color: str
    title: str


def breakdown_keys(runs: list[Run]) -> list[str]:
    """The breakdown's parts, in order: profile's (data wait, copy, compute) or a trace's."""
    keys: list[str] = []
    for run in runs:
        keys += [key for key in run.breakdown_pct if key not in keys]
    return keys or list(BREAKDOWN_KEYS)


def breakdown_bars(runs: list[Run], width: float = 560.0) -> list[dict[str, Any]]:
    """One horizontal stacked bar per run, scaled to the slowest run's mean step time."""
    longest = max((sum(r.breakdown_ms_per_step.values()) for r in runs), default=0.0) or 1.0
    rows = []
    for row, run in enumerate(runs):
        x, bars = 0.0, []
        for key in breakdown_keys(runs):
            ms = run.breakdown_ms_per_step.get(key, 0.0)
            w = width * ms / longest
            pct = run.breakdown_pct.get(key, 0.0)
            color = COLORS.get(key, UNKNOWN_COLOR)
            bars.append(Bar(x, row * 34.0, w, 24.0, color, f"{label_of(key)}: {ms:.1f} ms ({pct:.0f}%)"))
            x += w
        rows.append({"label": run.label, "bars": bars, "total_ms": sum(run.breakdown_ms_per_step.values())})
    return rows


def timeline_bars(run: Run, width: float = 560.0, height: float = 120.0, scale_ms: float = 0.0) -> list[Bar]:
    """One stacked column per timed step: data wait at the bottom (where a DataLoader was seen),
    the time outside a decorated function, the rest of the step above. (Copy time is known only
    for the traced steps, so it is not split out here.)"""
    steps = timed_steps(run.raw)
    if not steps:
        return []
    top = scale_ms or max(s.step_ms for s in steps)
    if not top > 0:  # every step lasted 0 us (a trace of zero-length events): nothing to draw
        return []
    column = width / len(steps)
    bars = []
    for i, s in enumerate(steps):
        y = height
        parts = {"data_wait": s.data_wait_ms} if "data_wait" in run.breakdown_pct else {}
        parts["h2d_copy"] = s.h2d_copy_ms
        if s.outside_call_ms is not None:
            parts[OUTSIDE_CALL] = s.outside_call_ms
        parts["compute"] = max(s.step_ms - sum(parts.values()), 0.0)
        for key, ms in parts.items():
            h = height * ms / top
            y -= h
            bars.append(
                Bar(
                    i * column + 1,
                    y,
                    max(column - 2, 1.0),
                    h,
                    COLORS[key],
                    f"step {s.index}: {LABELS[key]} {ms:.1f} ms of {s.step_ms:.1f} ms",
                )
            )
    return bars


def _window_lines(
    run: Run,
    main: Callable[[HostSample], float],
    workers: Callable[[HostSample], float],
    gpu: Callable[[GpuSample], float | None],
    floor: float,
    width: float,
    height: float,
) -> tuple[dict[str, str], float]:
    """SVG polyline points of the main process, its workers and the GPU over the timed
    window, on one scale from 0 to the largest value (at least `floor`); with that top."""
    window_ms = sum(s.step_ms for s in timed_steps(run.raw)) or 1.0
    host = window_samples(run.raw, run.raw.host_samples)
    sampled = window_samples(run.raw, run.raw.gpu_samples)
    # One line: the first GPU sampled (under torchrun each rank's GPU is sampled), and only
    # the samples that hold the value (a MIG instance reports no utilisation).
    first = sampled[0].device if sampled else None
    device = [(g.t_ms, value) for g in sampled if g.device == first and (value := gpu(g)) is not None]
    if len(host) < 2:
        return {}, 0.0
    top = max(floor, *(max(main(h), workers(h)) for h in host), *(v for _, v in device))

    def points(series: list[tuple[float, float]]) -> str:
        return " ".join(f"{width * t / window_ms:.1f},{height - height * v / top:.1f}" for t, v in series)

    lines = {
        "main": points([(h.t_ms, main(h)) for h in host]),
        "workers": points([(h.t_ms, workers(h)) for h in host]),
    }
    if len(device) >= 2:
        lines["gpu"] = points(device)
    return lines, top


def usage_lines(run: Run, width: float = 560.0, height: float = 80.0) -> dict[str, str]:
    """CPU use of the main process and of the DataLoader workers, and GPU utilisation when
    NVML sampled it, in percent."""
    lines, top = _window_lines(
        run, lambda h: h.main_cpu_pct, lambda h: h.workers_cpu_pct, lambda g: g.util_pct, 100.0, width, height
    )
    return {**lines, "top": f"{top:.0f}"} if lines else {}


def memory_lines(run: Run, width: float = 560.0, height: float = 80.0) -> dict[str, str]:
    """Resident memory of the main process and of the workers, and GPU memory in use when
    NVML sampled it, on one scale."""
    lines, top = _window_lines(
        run,
        lambda h: float(h.main_rss_bytes),
        lambda h: float(h.workers_rss_bytes),
        lambda g: float(g.memory_used_bytes) if g.memory_used_bytes is not None else None,
        1.0,
        width,
        height,
    )
    return {**lines, "top": f"{top / 1e9:.2f} GB"} if lines else {}


# ---- rendering ----


@functools.lru_cache(maxsize=4)
def _environment(templates: Path) -> jinja2.Environment:
    """One environment a templates folder: a run writes its report several times as its stages
    finish, and compiling the templates anew each time cost a third of a second a report."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates)),
        autoescape=jinja2.select_autoescape(["html", "html.j2"], default_for_string=False),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=mdtext.finalized,  # no control character or bidi override acts in either report
    )
    env.filters["num"] = _number
    env.filters["shell_line"] = mdtext.shell_line  # the command as a shell reads it back
    env.filters["diff_lines"] = _diff_lines
    env.filters["code_spans"] = _code_spans
    env.filters["md"], env.filters["md_cell"] = mdtext.inline, mdtext.cell
    env.filters["md_code"], env.filters["fence"] = mdtext.code, mdtext.fence
    return env


def _code_spans(text: str) -> markupsafe.Markup:
    """Text escaped for HTML, with its `backtick` spans as <code>."""
    parts = mdtext.spans(str(markupsafe.escape(text)))
    return markupsafe.Markup("".join(f"<code>{p}</code>" if is_code else p for p, is_code in parts))


def _diff_lines(diff: str) -> list[tuple[str, str]]:
    """(css class, text) of each line of a unified diff."""
    lines = []
    for line in diff.splitlines():
        if line.startswith(("+++", "---")):
            kind = "file"
        elif line.startswith("@@"):
            kind = "hunk"
        else:
            kind = {"+": "add", "-": "del"}.get(line[:1], "ctx")
        lines.append((kind, line))
    return lines


def _number(value: Any, digits: int = 1) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def _context(report: Report) -> dict[str, Any]:
    runs = [r for r in (report.baseline, after_of(report)) if r is not None]
    scale = max((s.step_ms for r in runs for s in timed_steps(r.raw)), default=0.0)
    keys = breakdown_keys(runs)
    return {
        "r": report,
        "headline": headline(report),
        "runs": runs,
        "breakdown": breakdown_bars(runs),
        "timelines": [(run, timeline_bars(run, scale_ms=scale)) for run in runs],
        "cpu": [(run, usage_lines(run)) for run in runs],
        "memory": [(run, memory_lines(run)) for run in runs],
        "step_memory": [(run, step_chart(run), peak_sites_text(run)) for run in runs if run.memory],
        "colors": {key: COLORS.get(key, UNKNOWN_COLOR) for key in {*COLORS, *keys}},
        "labels": {key: label_of(key) for key in {*LABELS, *keys}},
        "keys": keys,
        "loss_sentence": loss_sentence,
        "parallelism": parallelism,
        "communication": communication,
        "critical": critical,
        "rank_memory": rank_memory,
        "any_parallel": any(parallelism(run) for run in runs),
        "fix_line": fix_line,
        "energy_cell": energy_cell,
        "energy_title": energy_title,
        "mfu_cell": mfu_cell,
        "memory_cell": memory_cell,
        "memory_title": memory_title,
        "peak_sites_text": peak_sites_text,
        "mfu_title": mfu_title,
        "flops_cell": flops_cell,
        "after_line": after_line(report),
    }


def render_html(report: Report, templates: Path) -> str:
    return _environment(templates).get_template("report.html.j2").render(**_context(report))


def render_markdown(report: Report, templates: Path) -> str:
    return _environment(templates).get_template("report.md.j2").render(**_context(report))


def report_json(report: Report) -> str:
    return json.dumps(_serial.to_plain(report), indent=1, allow_nan=False) + "\n"


def write_report(
    report: Report,
    out_dir: Path,
    templates: Path,
    publish: Callable[[], None] | None = None,
    with_json: bool = True,
) -> None:
    """report.json, report.md and report.html, each written atomically (JSON first: the other
    two are renderings of it). All three are rendered before anything is written, then
    `publish` puts the staged traces and logs they name in place (`ReportFolder.publish`): a
    report that cannot be rendered leaves the folder as it was. The caller holds the folder
    (`report.folder.hold_out_dir`). `with_json=False` leaves report.json as it is: a saved
    report re-rendered in its own folder keeps the version it was saved in."""
    texts = {"report.json": report_json(report)} if with_json else {}
    if with_json and os.environ.get(schema.CHECK_ENV):
        if found := schema.problems(json.loads(texts["report.json"])):
            raise RuntimeError(f"{out_dir / 'report.json'} departs from its schema: " + "; ".join(found[:8]))
    texts["report.md"] = render_markdown(report, templates)
    texts["report.html"] = render_html(report, templates)
    out_dir.mkdir(parents=True, exist_ok=True)
    if publish is not None:
        publish()
    for name, text in texts.items():
        _serial.write_atomically(out_dir / name, text)


# Larger than any report written (1,024 ranks' summaries: a few MB): a bigger report.json is
# not one, and reading it whole would cost the machine's memory.
MAX_REPORT_BYTES = 50 * 2**20


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number a report holds")


def report_folder(path: Path) -> Path:
    """A saved report's folder, given the folder or its report.json."""
    return path.parent if path.name == "report.json" else path


def load_report(out_dir: Path) -> Report:
    """DIR/report.json of any version this one reads, as this version's report (`records.upgrade`),
    every field checked against its type: ValueError (`UnreadableVersion` for a version it does
    not know) where it is not one, naming where (a string for a number, NaN, a field missing)."""
    path = out_dir / "report.json"
    if path.stat().st_size > MAX_REPORT_BYTES:
        raise ValueError(f"larger than {MAX_REPORT_BYTES // 2**20} MiB, which no report is")
    plain = json.loads(path.read_text(encoding="utf-8", errors="replace"), parse_constant=_no_constant)
    if not isinstance(plain, dict):
        raise ValueError("not a JSON object")
    plain = upgraded(plain, SCHEMA_VERSION)
    kinds: dict[object, type[Report]] = {"profile": ProfileReport, "analyze": AnalyzeReport}
    if plain.get("kind") not in kinds:
        raise ValueError(f"kind {str(plain.get('kind'))[:40]!r} is neither 'profile' nor 'analyze'")
    try:
        report: Report = msgspec.convert(plain, kinds[plain["kind"]])
    except msgspec.ValidationError as exc:
        raise ValueError(str(exc)[:300]) from None
    return report


def terminal_summary(report: Report, out_dir: Path) -> str:
    """The diagnosis printed at the end of a run: fits in 80 columns, a dozen lines."""
    lines = _wrap(f"trainadvisor: {headline(report)}")
    base = report.baseline
    after = after_of(report)
    comparison = report.comparison if isinstance(report, ProfileReport) else None
    samples = comparison is not None and comparison.unit == "samples/s"
    if base is not None and base.steps:
        lines.append(_run_line("before", base, samples))
    if after is not None:
        if after.steps:
            lines.append(_run_line("after", after, samples))
        lines += _wrap(f"         {after_line(report, settings=False)}")
    if base is not None and base.memory is not None and base.memory.peak_bytes is not None:
        lines += _wrap(f"  memory of one step: {memory_cell(base)}")
        if sites := peak_sites_text(base, shown=3):
            lines += _wrap(f"  held at the peak by: {sites}")
    if base is not None and base.ranks:
        times = [r.step_time_ms_mean for r in base.ranks if r.step_time_ms_mean is not None]
        spread = f", step time {min(times):.1f}-{max(times):.1f} ms" if times else ""
        failed = [
            f"rank {r.rank} {r.status.replace('_', ' ')}" for r in base.ranks if r.status != "window_complete"
        ]
        lines += _wrap(f"  ranks: {len(base.ranks)}{spread}" + (f"; {', '.join(failed)}" if failed else ""))
    if base is not None and (parallel := parallelism(base)):
        lines += _wrap(f"  parallel: {parallel}")
    for line in (rank_memory(base) + communication(base) + critical(base)) if base is not None else []:
        lines += _wrap(f"  {line}")
    for finding in report.findings:
        lines += _wrap(f"  [{finding.severity}] {finding.rule}: {finding.message}")
    for outcome in fix_outcomes_of(report):
        lines += _wrap(f"  fix {outcome.fix}: {fix_line(outcome)}")
        if outcome.setting_change:
            lines += _wrap(f"      where to set it: {outcome.setting_change}")
    if comparison:
        lines += _wrap(f"  {loss_sentence(comparison.loss_check)}")
    for note in report.notes:
        lines += _wrap(f"  note: {note}")
    lines.append(f"  report: {out_dir / 'report.html'}")
    return "\n".join(lines)


def loss_sentence(check: LossCheck) -> str:
    if check.equivalent is None:
        return "training not compared: no scalar loss was seen in the steps"
    ranks = f" on each of {check.ranks_compared} ranks" if check.ranks_compared > 1 else ""
    if check.max_abs_diff == 0:
        return f"training unchanged: the loss of {check.steps_compared} seeded steps is identical{ranks}"
    verdict = "unchanged" if check.equivalent else "CHANGED"
    if check.changed_rank is not None:
        verdict = f"CHANGED on rank {check.changed_rank}"
    elif ranks:
        verdict = f"unchanged{ranks}"
    tolerance = f"tolerance {100 * check.tolerance_rel:.2g}%"
    if check.same_batches is False and check.mean_rel_diff is not None:
        return (
            f"training {verdict}: the mean loss of {check.steps_compared} seeded steps differs by "
            f"{100 * check.mean_rel_diff:.2g}% ({tolerance}; the batches differ between runs)"
        )
    return (
        f"training {verdict}: the loss of {check.steps_compared} seeded steps differs by at most "
        f"{check.max_abs_diff:.3g} ({100 * (check.max_rel_diff or 0):.2g}%, {tolerance})"
    )


def _wrap(text: str, width: int = 80) -> list[str]:
    indent = " " * (len(text) - len(text.lstrip()) + 4)
    return textwrap.wrap(text, width, subsequent_indent=indent, break_on_hyphens=False) or [text]


def _run_line(name: str, run: Run, samples: bool = False) -> str:
    pct = run.breakdown_pct
    rate = f"{run.samples_per_s or 0:9.1f} samples/s" if samples else f"{run.steps_per_s or 0:7.1f} steps/s"
    parts = f"data wait {pct['data_wait']:.0f}%" if "data_wait" in pct else NO_LOADER
    if OUTSIDE_CALL in pct:
        parts += f", {LABELS[OUTSIDE_CALL]} {pct[OUTSIDE_CALL]:.0f}%"
    return f"  {name:<6} {run.step_time_ms.median or 0:8.1f} ms/step median, {rate}, {parts}{mfu_words(run)}"
