"""`trainadvisor profile`: baseline run -> measurements -> findings -> fix plan -> tuning trials
-> confirmation run -> comparison -> report. Only `measure` touches processes and clocks; every
other stage is a pure function of the saved data before it."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from trainadvisor import engine, fixes
from trainadvisor.analysis.kineto import analyze_trace
from trainadvisor.analysis.ranks import rank_stats
from trainadvisor.analysis.summary import attach_trace, named_measurements, summarize
from trainadvisor.errors import NoStepsError, UsageError
from trainadvisor.judge import compare, judge_trial, loss_check, verdict
from trainadvisor.measure.runner import PROFILE_STEPS, RunSpec, measure
from trainadvisor.records import (
    SCHEMA_VERSION,
    Comparison,
    FixOutcome,
    FixStatus,
    Overrides,
    PlannedFix,
    RawRun,
    Report,
    Run,
    Trial,
    merge_overrides,
)
from trainadvisor.report import check_out_dir

MAX_TRIALS_PER_FIX = 8
# A loss tolerance is at least this many times the loss noise between two identical GPU runs.
NOISE_MARGIN = 4.0

# Findings whose evidence names lines of the user's code, found in a run traced with stacks.
SITE_RULES = ("host-sync", "cpu-tensor-creation")
SITE_KEYS = ("sync_site", "sync_sites", "cpu_tensor_site", "cpu_tensor_sites")
SITE_STEPS = 3

STEP_MARKING_HELP = (
    "trainadvisor finds steps through torch.optim optimizers' optimizer.step() (global optimizer "
    "hooks), or, where no optimizer is built, through backward(). If your loop does neither, add "
    "`import trainadvisor` and call "
    "`trainadvisor.step()` once at the end of every training step; outside trainadvisor the "
    "call does nothing."
)

Echo = Callable[[str], None]


@dataclass
class ProfileOptions:
    script: Path
    args: list[str]
    out_dir: Path
    warmup: int = 5
    steps: int = 20
    seed: int | None = 0
    rule_dirs: list[Path] = field(default_factory=list)
    run_to_end: bool = False
    apply_fixes: bool = True
    torchrun: list[str] = field(default_factory=list)  # torch.distributed.run options, if any
    timeout_s: float | None = None  # the longest a run may take (a hung rank ends here)


def reproduce_command(options: ProfileOptions) -> list[str]:
    """The command line that repeats this run, every option spelled out."""
    command = [
        "trainadvisor",
        "profile",
        "--warmup",
        str(options.warmup),
        "--steps",
        str(options.steps),
        "--out",
        str(options.out_dir),
    ]
    if options.seed is not None:
        command += ["--seed", str(options.seed)]
    for folder in options.rule_dirs:
        command += ["--rules", str(folder)]
    if options.run_to_end:
        command.append("--run-to-end")
    if not options.apply_fixes:
        command.append("--no-fix")
    if options.timeout_s is not None:
        command += ["--timeout", f"{options.timeout_s:g}"]
    return [*command, *options.torchrun, str(options.script), *options.args]


def _spec(options: ProfileOptions, label: str, **changes: Any) -> RunSpec:
    spec = RunSpec(
        label=label,
        script=options.script,
        args=options.args,
        out_dir=options.out_dir,
        warmup=options.warmup,
        steps=options.steps,
        seed=options.seed,
        torchrun=options.torchrun,
        timeout_s=options.timeout_s,
    )
    return replace(spec, **changes)  # type: ignore[arg-type]


def _with_overrides(options: ProfileOptions, label: str, overrides: Overrides, **changes: Any) -> RunSpec:
    """A run that tries a fix. Workers fill up to workers x prefetch_factor batches while the
    first, slow steps run; consumed inside the window, that buffer would pass for speed. So the
    warmup is lengthened by the buffer's depth and the window made at least three times as long
    as it."""
    buffered = overrides.buffered_batches()
    return _spec(
        options,
        label,
        warmup=options.warmup + buffered,
        steps=max(options.steps, 3 * buffered),
        overrides=overrides,
        **changes,
    )


def _measure_run(spec: RunSpec) -> Run:
    raw = measure(spec)
    trace = attach_trace(raw, spec.out_dir, spec.script)
    run = summarize(raw)
    run.trace = trace
    if raw.ranks:
        communication = {}
        for rank in raw.ranks:
            if rank.trace_file and (spec.out_dir / rank.trace_file).is_file():
                analysis = analyze_trace(spec.out_dir / rank.trace_file)
                share = analysis.breakdown_pct.get("communication") if analysis.kernels else None
                communication[rank.rank or 0] = (share, analysis.communication_overlap_pct)
        run.ranks = rank_stats(raw, communication)
    return run


def _check_steps(raw: RawRun, options: ProfileOptions) -> None:
    if raw.status == "script_failed":
        return
    if raw.steps_seen == 0:
        raise NoStepsError(
            f"{options.script} ran to the end but no training step was seen. " + STEP_MARKING_HELP
        )
    if not raw.steps:
        raise UsageError(
            f"{options.script} ran only {raw.steps_seen} step(s), all inside the warmup of "
            f"{options.warmup}: lower --warmup, or pass arguments that make the script train longer"
        )


def _call_sites(options: ProfileOptions, baseline: Run, echo: Echo) -> dict[str, Any]:
    """Where in the script the syncs and host-made tensors are: a short run traced with Python
    stacks (its own process: the stacks' overhead must not touch the measured steps)."""
    echo(f"trainadvisor: tracing {SITE_STEPS} steps with Python stacks to find the lines behind them")
    spec = _spec(
        options, "sites", steps=SITE_STEPS, with_stack=True, show_output=False,
        timeout_s=max(60.0, 5 * baseline.raw.wall_s),
    )  # fmt: skip
    raw = measure(spec)
    if not raw.trace_file:
        return {}
    table = attach_trace(raw, options.out_dir, options.script)
    return {key: table[key] for key in SITE_KEYS if key in table}


def loss_noise(options: ProfileOptions, baseline: Run, echo: Echo) -> float | None:
    """How far the loss of the same seeded steps moves between two identical runs: on a GPU,
    atomics-based kernels (cuDNN weight gradients, embedding backward) sum in a varying order,
    so a bit-for-bit tolerance would reject every fix. Measured by running the baseline's steps
    once more; None when that run does not complete or records no comparable loss. A CPU run is
    not repeated: its arithmetic is deterministic, and the tolerances stay as they are."""
    echo("trainadvisor: running the baseline's seeded steps again to measure the GPU's loss noise")
    timeout_s = max(60.0, 5 * baseline.raw.wall_s)
    spec = _spec(options, "noise", profile=False, show_output=False, timeout_s=timeout_s)
    raw = measure(spec)
    if raw.status != "window_complete":
        return None
    check = loss_check(baseline.raw, raw, 0.0)
    if not check.steps_compared or check.max_rel_diff is None or check.max_rel_diff == float("inf"):
        return None
    return check.mean_rel_diff if check.same_batches is False else check.max_rel_diff


def tolerance(fix: fixes.Fix, noise_rel: float | None) -> float:
    """The fix's own loss tolerance, raised above the measured noise of identical runs."""
    return max(fix.loss_tolerance_rel, NOISE_MARGIN * (noise_rel or 0.0))


def tune(
    fix: fixes.Fix,
    values: dict[str, Any],
    options: ProfileOptions,
    baseline: Run,
    echo: Echo,
    noise_rel: float | None = None,
) -> list[Trial]:
    trials: list[Trial] = []
    timeout_s = max(60.0, 5 * baseline.raw.wall_s)
    while len(trials) < MAX_TRIALS_PER_FIX:
        candidate = fix.next_candidate(values, trials)
        if candidate is None:
            break
        label = f"{fix.id}-{len(trials) + 1}"
        run = _measure_run(
            _with_overrides(
                options,
                label,
                candidate.overrides,
                profile=False,
                show_output=False,
                timeout_s=timeout_s,
            )
        )
        status, reason = judge_trial(baseline.raw, run.raw, tolerance(fix, noise_rel))
        trial = Trial(
            candidate.label, candidate.overrides, status, run.steps_per_s, reason, run.raw, run.samples_per_s
        )
        trials.append(trial)
        value = fixes.trial_value(trial, fix.metric)
        if fix.metric == "peak_reserved_bytes":
            shown = f"peak reserved {value / 1e9:.2f} GB" if status == "measured" and value else status
        else:
            shown = (
                f"{value:.1f} {fix.metric.removesuffix('_per_s')}/s"
                if status == "measured" and value
                else status
            )
        echo(f"  tried {candidate.label}: {shown}" + (f" ({reason})" if reason else ""))
    return trials


Save = Callable[[Report], None]


@dataclass(frozen=True)
class _Diagnosed:
    """The baseline and what the rules found in it: the stage every later one starts from."""

    baseline: Run
    diagnosis: engine.Diagnosis
    plan: list[PlannedFix]
    notes: list[str]


def profile(options: ProfileOptions, echo: Echo, save: Save | None = None) -> Report:
    """baseline -> diagnosis -> each fix's trials -> confirmation, each stage's report handed to
    `save` as it finishes (an interruption leaves the report of what was measured); returns the
    last."""
    started = time.monotonic()
    keep = save or (lambda _report: None)
    rules = _prepare(options)
    echo(
        f"trainadvisor: running {options.script} (warmup {options.warmup} steps, timing "
        f"{options.steps} steps, then tracing up to {PROFILE_STEPS} with torch.profiler)"
    )
    baseline = _measure_run(_spec(options, "baseline", stop_after_window=not options.run_to_end))
    _check_steps(baseline.raw, options)
    diagnosed = _diagnose_baseline(options, rules, baseline, echo)
    blocked = _why_no_fixes(options, baseline)
    if blocked is not None or not options.apply_fixes:
        report = _report(options, diagnosed, started, _not_tried(diagnosed.plan), extra_notes=[blocked])
        keep(report)
        return report
    keep(_report(options, diagnosed, started, _not_tried(diagnosed.plan)))
    noise_rel = None
    notes = []
    if diagnosed.diagnosis.values.get("cuda_used") and any(p.applicable for p in diagnosed.plan):
        noise_rel = loss_noise(options, baseline, echo)
        notes.append(_noise_note(noise_rel))
    outcomes = _not_tried(diagnosed.plan)
    for i, planned in enumerate(diagnosed.plan):
        if planned.applicable:
            outcomes[i] = _tune_fix(planned, diagnosed, options, echo, noise_rel)
            keep(_report(options, diagnosed, started, outcomes, extra_notes=notes, noise_rel=noise_rel))
    report = _confirm(options, diagnosed, started, outcomes, notes, noise_rel, echo)
    keep(report)
    return report


def _prepare(options: ProfileOptions) -> list[engine.Rule]:
    """What can be refused before anything runs: the script, the rules, the report folder."""
    if not options.script.is_file():
        raise UsageError(f"{options.script}: no such script; give the path of a Python training script")
    rules = engine.rules_for(options.rule_dirs)
    check_out_dir(options.out_dir)
    return rules


def _diagnose_baseline(
    options: ProfileOptions, rules: list[engine.Rule], baseline: Run, echo: Echo
) -> _Diagnosed:
    """The rules over the baseline; when a finding names lines of code, the baseline's trace
    measurements gain the call sites of a separate run traced with Python stacks."""
    notes = []
    if baseline.raw.step_source == "backward":
        notes.append(
            "No torch.optim optimizer was built, so each backward() ended a training step (a loop "
            "that updates its parameters by hand); call trainadvisor.step() to mark steps yourself."
        )
    if 0 < baseline.steps < options.steps:
        notes.append(f"The script ended after {baseline.steps} of the {options.steps} timed steps.")
    diagnosis = engine.diagnose(named_measurements(baseline), rules)
    if any(f.rule in SITE_RULES for f in diagnosis.findings) and baseline.raw.status != "script_failed":
        sites = _call_sites(options, baseline, echo)
        if sites:
            baseline = replace(baseline, trace={**baseline.trace, **sites})
            diagnosis = engine.diagnose(named_measurements(baseline), rules)
            notes.append(
                "The lines named for syncs and host-made tensors come from a separate run of "
                f"{SITE_STEPS} steps traced with Python stacks (traces/sites/), kept apart because "
                "the Python tracer slows the host."
            )
    return _Diagnosed(baseline, diagnosis, fixes.plan(diagnosis.findings, diagnosis.values), notes)


def _why_no_fixes(options: ProfileOptions, baseline: Run) -> str | None:
    if baseline.raw.status == "script_failed":
        return "The script failed, so no fix was tried."
    if options.apply_fixes and any(option in ("--nnodes", "--node-rank") for option in options.torchrun):
        return (
            "Fixes are not measured on several nodes: each node would choose its trials from its "
            "own ranks and start different runs against one rendezvous. Measure them on one node "
            "(--nproc-per-node) or apply them by hand."
        )
    return None


def _not_tried(plan: list[PlannedFix]) -> list[FixOutcome]:
    """Each planned fix before its trials: not applicable (and why), or not run yet."""
    return [
        FixOutcome(p.fix, p.rule, "not_applicable", p.reason, Overrides(), [])
        if not p.applicable
        else FixOutcome(
            p.fix, p.rule, "not_run", "not measured: the run ended before this fix's trials", Overrides(), []
        )
        for p in plan
    ]


def _report(
    options: ProfileOptions,
    diagnosed: _Diagnosed,
    started: float,
    outcomes: list[FixOutcome],
    after: Run | None = None,
    comparison: Comparison | None = None,
    extra_notes: list[str | None] | None = None,
    noise_rel: float | None = None,
) -> Report:
    return Report(
        schema_version=SCHEMA_VERSION,
        command=reproduce_command(options),
        script=str(options.script),
        environment=diagnosed.baseline.raw.device,
        baseline=diagnosed.baseline,
        findings=diagnosed.diagnosis.findings,
        after=after,
        plan=diagnosed.plan,
        fix_outcomes=outcomes,
        applied_fixes=[o.fix for o in outcomes if o.status == "kept"],
        speedup=comparison.speedup if comparison else None,
        comparison=comparison,
        notes=[*diagnosed.notes, *(n for n in extra_notes or [] if n)],
        elapsed_s=time.monotonic() - started,
        loss_noise_rel=noise_rel,
    )


def _confirm(
    options: ProfileOptions,
    diagnosed: _Diagnosed,
    started: float,
    outcomes: list[FixOutcome],
    notes: list[str],
    noise_rel: float | None,
    echo: Echo,
) -> Report:
    """The fixes chosen by their trials, measured together in one fresh run: kept only if that
    run is faster and trains the same; each kept or recommended fix gets its code change."""
    chosen = [o for o in outcomes if o.status == "unconfirmed"]
    after, comparison = None, None
    verdicts: dict[str, tuple[FixStatus, str]] = {}
    if chosen:
        echo("trainadvisor: confirming the chosen settings in a fresh profiled run")
        merged = merge_overrides([o.settings for o in chosen])
        after = _measure_run(_with_overrides(options, "after", merged, show_output=False))
        kept_fixes = [fixes.REGISTRY[o.fix] for o in chosen]
        comparison = compare(
            diagnosed.baseline,
            after,
            max(tolerance(fix, noise_rel) for fix in kept_fixes),
            per_sample=any(fix.metric == "samples_per_s" for fix in kept_fixes),
        )
        status, reason = verdict(comparison)
        if after.raw.status != "window_complete":
            status, reason = "failed", after.raw.error or "the confirmation run did not complete"
        verdicts = {o.fix: (status, reason) for o in chosen}
    final = [_final(options, o, verdicts) for o in outcomes]
    return _report(options, diagnosed, started, final, after, comparison, notes, noise_rel)


def _final(
    options: ProfileOptions, outcome: FixOutcome, verdicts: dict[str, tuple[FixStatus, str]]
) -> FixOutcome:
    """The outcome as the report keeps it: the confirmation's verdict for a chosen fix, and the
    change to the user's script for what is kept or recommended."""
    if outcome.fix in verdicts:
        status, reason = verdicts[outcome.fix]
        outcome = replace(outcome, status=status, reason=reason)
    if outcome.status in ("kept", "recommended"):
        outcome = replace(outcome, diff=fixes.code_diff(options.script, outcome.fix, outcome.settings) or "")
    return outcome


def _noise_note(noise_rel: float | None) -> str:
    if noise_rel is None:
        return (
            "The baseline's seeded steps were run twice to measure the GPU's loss noise, but the "
            "second run did not complete: fixes were held to their own loss tolerances."
        )
    return (
        f"Two identical runs of the baseline's seeded steps differed in loss by up to "
        f"{100 * noise_rel:.3g}% (GPU kernels that sum in a varying order); every fix was held to "
        f"at least {NOISE_MARGIN:g}x that."
    )


def _tune_fix(
    planned: PlannedFix, diagnosed: _Diagnosed, options: ProfileOptions, echo: Echo, noise_rel: float | None
) -> FixOutcome:
    """One fix's trials and what they decide: chosen (`unconfirmed` until the confirmation run,
    or `recommended` for a memory fix, which is not part of the speed run), or why not."""
    fix = fixes.REGISTRY[planned.fix]
    values = diagnosed.diagnosis.values
    echo(f"trainadvisor: {planned.rule} -> measuring fix {planned.fix}")
    trials = tune(fix, values, options, diagnosed.baseline, echo, noise_rel)
    chosen = fix.choose(trials, values)
    if chosen is not None:
        described = fix.describe(chosen, values)
        if fixes.goal(planned.fix) == "memory":
            status, reason = "recommended", "measured in its own run; " + described
        else:
            status, reason = "unconfirmed", "chosen by its trials; the run ended before the confirmation run"
        return FixOutcome(planned.fix, planned.rule, status, reason, chosen.overrides, trials, described)
    blocked = next((t for t in trials if t.status != "measured"), None)
    if blocked is not None and not any(t.status == "measured" for t in trials):
        # refused | failed | changed_training
        return FixOutcome(
            planned.fix,
            planned.rule,
            blocked.status,
            f"{blocked.label}: {blocked.reason}",
            Overrides(),
            trials,
        )
    return FixOutcome(planned.fix, planned.rule, "no_gain", fixes.no_gain(fix), Overrides(), trials)
