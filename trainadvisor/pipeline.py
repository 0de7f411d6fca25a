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
from trainadvisor.codechange import fix_diff
from trainadvisor.compare import compare, judge_trial, loss_check, verdict
from trainadvisor.errors import NoStepsError, UsageError
from trainadvisor.measure.runner import PROFILE_STEPS, RunSpec, measure
from trainadvisor.model import SCHEMA_VERSION, FixOutcome, PlannedFix, RawRun, Report, Run, Trial
from trainadvisor.report import check_out_dir
from trainadvisor.resources import rules_dir

MAX_TRIALS_PER_FIX = 8
# A loss tolerance is at least this many times the loss noise between two identical GPU runs.
NOISE_MARGIN = 4.0

# Findings whose evidence names lines of the user's code, found in a run traced with stacks.
SITE_RULES = ("host-sync", "cpu-tensor-creation")
SITE_KEYS = ("sync_site", "sync_sites", "cpu_tensor_site", "cpu_tensor_sites")
SITE_STEPS = 3

STEP_MARKING_HELP = (
    "trainadvisor finds steps through torch.optim optimizers' step() (global optimizer hooks). "
    "If your loop does not call optimizer.step(), add `import trainadvisor` and call "
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


def _with_loader_overrides(
    options: ProfileOptions, label: str, overrides: dict[str, Any], **changes: Any
) -> RunSpec:
    """A run with DataLoader overrides. Workers fill up to workers x prefetch_factor batches
    while the first, slow steps run; consumed inside the window, that buffer would pass for
    speed. So the warmup is lengthened by the buffer's depth and the window made at least three
    times as long as it."""
    buffered = sum(
        int(loader.get("num_workers", 0)) * int(loader.get("prefetch_factor", 2))
        for loader in overrides["loaders"].values()
    )
    return _spec(
        options,
        label,
        warmup=options.warmup + buffered,
        steps=max(options.steps, 3 * buffered),
        loader_overrides=overrides["loaders"],
        non_blocking_h2d=overrides["non_blocking_h2d"],
        runtime_overrides=overrides.get("runtime", {}),
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
            _with_loader_overrides(
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


def profile(options: ProfileOptions, echo: Echo) -> Report:
    started = time.monotonic()
    if not options.script.is_file():
        raise UsageError(f"{options.script}: no such script; give the path of a Python training script")
    rules = engine.load_rules([rules_dir(), *options.rule_dirs])
    check_out_dir(options.out_dir)
    echo(
        f"trainadvisor: running {options.script} (warmup {options.warmup} steps, timing "
        f"{options.steps} steps, then tracing up to {PROFILE_STEPS} with torch.profiler)"
    )
    baseline = _measure_run(_spec(options, "baseline", stop_after_window=not options.run_to_end))
    _check_steps(baseline.raw, options)
    notes: list[str] = []
    if 0 < baseline.steps < options.steps:
        notes.append(f"The script ended after {baseline.steps} of the {options.steps} timed steps.")
    values = named_measurements(baseline)
    findings = engine.evaluate(rules, values)
    if any(f.rule in SITE_RULES for f in findings) and baseline.raw.status != "script_failed":
        sites = _call_sites(options, baseline, echo)
        if sites:
            baseline.trace.update(sites)
            values = named_measurements(baseline)
            findings = engine.evaluate(rules, values)
            notes.append(
                "The lines named for syncs and host-made tensors come from a separate run of "
                f"{SITE_STEPS} steps traced with Python stacks (traces/sites/), kept apart because "
                "the Python tracer slows the host."
            )
    plan = fixes.plan(findings, values)
    noise_rel: float | None = None
    outcomes: list[FixOutcome] = []
    after: Run | None = None
    comparison = None
    multi_node = any(option in ("--nnodes", "--node-rank") for option in options.torchrun)
    if baseline.raw.status == "script_failed":
        notes.append("The script failed, so no fix was tried.")
    elif options.apply_fixes and multi_node:
        notes.append(
            "Fixes are not measured on several nodes: each node would choose its trials from its "
            "own ranks and start different runs against one rendezvous. Measure them on one node "
            "(--nproc-per-node) or apply them by hand."
        )
    elif options.apply_fixes:
        if values.get("cuda_used") and any(p.applicable for p in plan):
            noise_rel = loss_noise(options, baseline, echo)
            notes.append(_noise_note(noise_rel))
        outcomes = _tune_all(plan, values, options, baseline, echo, noise_rel)
        for outcome in outcomes:  # memory fixes trade speed for memory: not part of the speed run
            if outcome.status == "kept" and fixes.goal(outcome.fix) == "memory":
                outcome.status, outcome.reason = "recommended", "measured in its own run; " + outcome.chosen
        kept = [o for o in outcomes if o.status == "kept"]
        if kept:
            echo("trainadvisor: confirming the chosen settings in a fresh profiled run")
            merged = fixes.merge_overrides([o.settings for o in kept])
            after = _measure_run(_with_loader_overrides(options, "after", merged, show_output=False))
            kept_fixes = [fixes.REGISTRY[o.fix] for o in kept]
            comparison = compare(
                baseline,
                after,
                max(tolerance(fix, noise_rel) for fix in kept_fixes),
                per_sample=any(fix.metric == "samples_per_s" for fix in kept_fixes),
            )
            status, reason = verdict(comparison)
            if after.raw.status != "window_complete":
                status, reason = "failed", after.raw.error or "the confirmation run did not complete"
            for outcome in kept:
                outcome.status, outcome.reason = status, reason
        for outcome in outcomes:  # what to change in the script to keep what was measured
            if outcome.status in ("kept", "recommended"):
                outcome.diff = fix_diff(options.script, outcome.fix, outcome.settings) or ""
    return Report(
        schema_version=SCHEMA_VERSION,
        command=reproduce_command(options),
        script=str(options.script),
        environment=baseline.raw.device,
        baseline=baseline,
        after=after,
        findings=findings,
        plan=plan,
        fix_outcomes=outcomes,
        applied_fixes=[o.fix for o in outcomes if o.status == "kept"],
        speedup=comparison.speedup if comparison else None,
        comparison=comparison,
        notes=notes,
        elapsed_s=time.monotonic() - started,
        loss_noise_rel=noise_rel,
    )


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


def _tune_all(
    plan: list[PlannedFix],
    values: dict[str, Any],
    options: ProfileOptions,
    baseline: Run,
    echo: Echo,
    noise_rel: float | None = None,
) -> list[FixOutcome]:
    outcomes = []
    for planned in plan:
        if not planned.applicable:
            outcomes.append(FixOutcome(planned.fix, planned.rule, "not_applicable", planned.reason, {}, []))
            continue
        fix = fixes.REGISTRY[planned.fix]
        echo(f"trainadvisor: {planned.rule} -> measuring fix {planned.fix}")
        trials = tune(fix, values, options, baseline, echo, noise_rel)
        chosen = fix.choose(trials, float(values.get(fix.metric) or 0.0))
        if chosen is not None:
            outcomes.append(
                FixOutcome(
                    planned.fix,
                    planned.rule,
                    "kept",
                    "chosen by the trials",
                    chosen.overrides,
                    trials,
                    fix.describe(chosen),
                )
            )
            continue
        blocked = next((t for t in trials if t.status != "measured"), None)
        if blocked is not None and not any(t.status == "measured" for t in trials):
            status = blocked.status  # refused | failed | changed_training
            outcomes.append(
                FixOutcome(
                    planned.fix, planned.rule, status, f"{blocked.label}: {blocked.reason}", {}, trials
                )
            )
        else:
            outcomes.append(
                FixOutcome(
                    planned.fix,
                    planned.rule,
                    "no_gain",
                    fixes.no_gain(fix),
                    {},
                    trials,
                )
            )
    return outcomes
