"""`trainadvisor profile`: baseline run -> measurements -> findings -> fix plan -> tuning trials
-> confirmation run -> comparison -> report. Only `measure` touches processes and clocks; every
other stage is a pure function of the saved data before it."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import psutil

from trainadvisor import fixes, rulebook
from trainadvisor.analyze.run.disturbance import disturbance_notes
from trainadvisor.analyze.run.length import run_length
from trainadvisor.analyze.run.shapes import baseline_note, window_notes
from trainadvisor.analyze.run.summary import attach_trace, input_note, named_measurements
from trainadvisor.errors import Terminated, UsageError
from trainadvisor.measure.config import WindowSize
from trainadvisor.measure.kept_alive import LiveRun, Prestarted
from trainadvisor.measure.runner import measure
from trainadvisor.profile import rescue
from trainadvisor.profile.ahead import kept_ahead, start_ahead
from trainadvisor.profile.baseline import check_steps, fitted_baseline, too_short
from trainadvisor.profile.confirm import confirm
from trainadvisor.profile.pace import setup_s
from trainadvisor.profile.runs import (
    ProfileOptions,
    measure_run,
    reproduce_command,
    run_of,
    spec_for,
    window_words,
)
from trainadvisor.profile.trials import Echo, loss_noise, noise_note
from trainadvisor.profile.tuning import Tuning
from trainadvisor.records import (
    SCHEMA_VERSION,
    Comparison,
    FixOutcome,
    Overrides,
    PlannedFix,
    ProfileReport,
    Run,
    RunLength,
)
from trainadvisor.records.identity import file_digest, run_id
from trainadvisor.redact import mask_arguments, masked_note
from trainadvisor.report.folder import hold_out_dir

# Findings whose evidence names lines of the user's code, found in a run traced with stacks.
SITE_RULES = ("host-sync", "cpu-tensor-creation")
SITE_KEYS = ("sync_site", "sync_sites", "cpu_tensor_site", "cpu_tensor_sites")
SITE_STEPS = 3


def _call_sites(options: ProfileOptions, baseline: Run, echo: Echo) -> dict[str, Any]:
    """Where in the script the syncs and host-made tensors are: a short run traced with Python
    stacks (its own process: the stacks' overhead must not touch the measured steps)."""
    echo(f"trainadvisor: tracing {SITE_STEPS} steps with Python stacks to find the lines behind them")
    spec = spec_for(
        options, "sites", steps=SITE_STEPS, with_stack=True, show_output=False,
        timeout_s=max(60.0, 5 * baseline.raw.wall_s), size=WindowSize(),  # steps to trace, not timings
    )  # fmt: skip
    raw = measure(spec)
    if not raw.trace_file:
        return {}
    table = attach_trace(raw, spec.out_dir, options.script)
    return {key: table[key] for key in SITE_KEYS if key in table}


# Writes a stage's report; the callable publishes the traces and logs it names, called once the
# report is rendered and before it is written (`render.write_report`).
Save = Callable[[ProfileReport, Callable[[], None]], None]


@dataclass(frozen=True)
class _Diagnosed:
    """The baseline and what the rules found in it: the stage every later one starts from."""

    baseline: Run
    diagnosis: rulebook.Diagnosis
    plan: list[PlannedFix]
    notes: list[str]
    details: list[str] = field(default_factory=list)  # how it was measured (report files only)
    content: str = ""  # the digest of the script the baseline ran (`records.identity`)
    # the script's length as far as its runs told it: a baseline the script's end cut short told
    # it, where the fitted one measured again in its place may not have reached the end
    length: RunLength | None = None


@dataclass(frozen=True)
class _Job:
    """What every stage of one `profile` command shares."""

    options: ProfileOptions
    rules: list[rulebook.Rule]
    echo: Echo
    keep: Callable[[ProfileReport], None]  # a stage's report: its traces and logs published, it written
    started: float  # time.monotonic()


INTERRUPTED = "The run was interrupted: fixes marked not run or unconfirmed were not measured to the end."


def profile(options: ProfileOptions, echo: Echo, save: Save | None = None) -> ProfileReport:
    """baseline -> diagnosis -> each fix's trials -> confirmation, each stage's report handed to
    `save` as it finishes; returns the last. Interrupted (Ctrl-C, SIGTERM), the last report
    saved is saved again with a note that says so. The report folder is held throughout
    (`hold_out_dir`): the runs write their traces and logs into its staging folder, published
    once a report is rendered, just before it is written: an earlier report stays whole until
    then."""
    rules, keep = _prepare(options), save or (lambda _report, _publish: None)
    with hold_out_dir(options.out_dir) as folder:
        saved: list[ProfileReport] = []

        def publish_and_save(report: ProfileReport) -> None:
            keep(report, folder.publish)
            saved[:] = [report]

        staged = replace(options, stage_dir=folder.stage)
        try:
            return _profile(_Job(staged, rules, echo, publish_and_save, time.monotonic()))
        except (KeyboardInterrupt, Terminated):
            if saved:  # its traces are in place already (and the stage may hold half-written ones)
                keep(replace(saved[0], notes=[*saved[0].notes, INTERRUPTED]), lambda: None)
            raise


def _profile(job: _Job) -> ProfileReport:
    options, echo = job.options, job.echo
    spec = spec_for(options, "baseline", stop_after_window=not options.run_to_end)
    echo(f"trainadvisor: running {options.script} ({window_words(options, spec.size)})")
    why_restart = _why_restart(options)
    live, prestarted = None, None
    try:
        if why_restart is None:  # kept alive after its window, for trial windows
            live = LiveRun(replace(spec, session_dir=spec.out_dir / ".work" / "session"))
            prestarted = start_ahead(options)  # let into the script at the baseline's first step
        let_in = prestarted.release if prestarted is not None else None
        baseline = run_of(live.baseline(let_in), spec) if live is not None else measure_run(spec)
        if prestarted is not None and (too_short(baseline.raw) or rescue.died_of_oom(baseline.raw)):
            prestarted.cancel()  # fresh runs follow
            prestarted = None
        fitted = fitted_baseline(options, spec, baseline, echo) if too_short(baseline.raw) else None
        cut = baseline.raw
        if fitted is not None:
            if live is not None:
                live.close()
                live = None
            baseline, why_restart = fitted
        check_steps(baseline.raw, options)
        diagnosed = replace(_diagnose_baseline(options, job.rules, baseline), length=run_length(cut))
        blocked = _why_no_fixes(options, baseline)
        if blocked is None and options.apply_fixes and rescue.died_of_oom(baseline.raw):
            if live is not None:  # it died: nothing is left to measure in its process
                live.close()
                live = None
            return _after_oom(job, diagnosed)
        if blocked is None and options.apply_fixes:
            plan, values = diagnosed.plan, diagnosed.diagnosis.values
            prestarted = kept_ahead(prestarted, plan, values)
            return _measure_fixes(job, diagnosed, live, why_restart, prestarted)
        if live is not None:  # diagnosis only: no fix outcome to report
            live.close()
        diagnosed = _with_sites(options, job.rules, diagnosed, echo)
        report = _report(options, diagnosed, job.started, [], extra_notes=[blocked])
        job.keep(report)
        return report
    finally:  # each run ended, whatever ending another raises
        try:
            if live is not None:
                live.close()
        finally:
            if prestarted is not None:
                prestarted.cancel()


def _measure_fixes(
    job: _Job,
    diagnosed: _Diagnosed,
    live: LiveRun | None,
    why_restart: str | None,
    prestarted: Prestarted | None,
) -> ProfileReport:
    """Each fix's trials (in windows of the live run where they can switch there, else in
    fresh runs), then the confirmation run; the report saved after each."""
    options, started = job.options, job.started
    samples = diagnosed.baseline.raw.host_samples
    beside = max((h.main_rss_bytes for h in samples), default=0) if prestarted is not None else 0
    tuning = _tuning(options, diagnosed, job.echo, started, beside)
    if prestarted is not None:  # the confirmation waits for what is left of its set-up
        its_setup_s = setup_s(diagnosed.baseline.raw)
        tuning.ahead_left = lambda: prestarted.setup_left(its_setup_s)
    tuning.on_progress = lambda: job.keep(
        _report(options, diagnosed, started, tuning.outcomes, noise_rel=None, tuning=tuning)
    )
    tuning.on_progress()
    try:
        if live is not None:
            tuning.in_process(live)
            live.stop_soon()  # it ends while the next run starts; closed once the report is made
        diagnosed = _with_sites(options, job.rules, diagnosed, job.echo)
        noise_rel = None
        to_judge = [o.fix for o in tuning.outcomes if o.status == "unconfirmed"]  # by the confirmation run
        to_judge += [
            p.fix for p in diagnosed.plan if p.applicable and p.fix not in tuning.tried
        ]  # fresh runs
        if diagnosed.diagnosis.values.get("cuda_used") and to_judge:
            noise_rel = loss_noise(options, diagnosed.baseline, job.echo)
            tuning.details.append(noise_note(noise_rel))
        tuning.restarted(noise_rel, why_restart or "")
        # where pairs of windows measured the script's own setting last, with no fresh run since,
        # it stands beside the confirmation run already; else it is measured again after it
        paired_last = tuning.again is not None and not tuning.walls["fresh"]
        adjacent = None if paired_last else tuning.measure_again
        report = _confirm(options, diagnosed, started, tuning, noise_rel, job.echo, prestarted, adjacent)
        if live is not None:  # nothing more is measured: the live run's exit may take a core
            live.raise_back()
        job.keep(report)  # while the confirmation run exits
    finally:
        if prestarted is not None:
            prestarted.cancel()
    return report


def _after_oom(job: _Job, diagnosed: _Diagnosed) -> ProfileReport:
    """The script died of out-of-memory: each fix its diagnosis proposes, in fresh runs of the
    script, recommended where its run got through (`profile.rescue`); the report saved after each."""
    options, started = job.options, job.started
    tuning = _tuning(options, diagnosed, job.echo, started)

    def report(notes: list[str | None]) -> ProfileReport:
        script, raw = options.script, diagnosed.baseline.raw
        outcomes = [rescue.rescued(o, script, raw) for o in tuning.outcomes]
        return _report(options, diagnosed, started, outcomes, extra_notes=notes, tuning=tuning)

    tuning.on_progress = lambda: job.keep(report([]))
    tuning.on_progress()
    tuning.restarted(None, rescue.WHY_RESTART)
    final = report([rescue.note(tuning.outcomes)])
    job.keep(final)
    return final


def _why_restart(options: ProfileOptions) -> str | None:
    """Why no trial can run as a window of the baseline's process, or None."""
    if not options.apply_fixes:
        return "diagnosis only"
    if options.trials == "restart":
        return "--trials restart was given"
    if options.torchrun:
        return "under torchrun every rank would have to switch its setting at the same step"
    if options.run_to_end:
        return "--run-to-end lets the baseline run finish"
    return None


def _tuning(
    options: ProfileOptions, diagnosed: _Diagnosed, echo: Echo, started: float, beside_bytes: int = 0
) -> Tuning:
    """The fixes' search, over the diagnosis's measurements and the memory left: what the machine
    has free less `beside_bytes` (a confirmation run started ahead, still setting up, will hold
    about as much as the baseline's script did)."""
    available = max(0, psutil.virtual_memory().available - beside_bytes)
    values = {**diagnosed.diagnosis.values, "memory_available_bytes": available}
    if options.max_workers is not None:
        values["worker_cap"] = options.max_workers  # --max-workers
    plan = diagnosed.plan
    tuning = Tuning(
        options, plan, values, diagnosed.baseline, echo, started, _not_tried(plan), length=diagnosed.length
    )
    tuning.learn(diagnosed.baseline.raw)
    return tuning


def _prepare(options: ProfileOptions) -> list[rulebook.Rule]:
    """What can be refused before anything runs: the script, the fixes named, the rules (the
    report folder is checked when it is locked, `hold_out_dir`)."""
    if not options.script.is_file():
        raise UsageError(f"{options.script}: no such script; give the path of a Python training script")
    unknown = [fix for fix in options.only_fixes if fix not in fixes.REGISTRY]
    if unknown:
        raise UsageError(
            f"--fix {unknown[0]}: no such fix; the fixes are {', '.join(sorted(fixes.REGISTRY))}"
        )
    return rulebook.rules_for(options.rule_dirs)


def _diagnose_baseline(options: ProfileOptions, rules: list[rulebook.Rule], baseline: Run) -> _Diagnosed:
    """The rules over the baseline, and the fixes they propose (those `--fix` names, if given)."""
    notes: list[str | None] = []
    if options.torchrun:
        notes.append(
            f"Under torchrun each window is a count of steps ({options.warmup} warm-up, {options.steps} "
            "timed), with no steadiness test or time floor: every rank must stop at the same step. "
            "Raise --warmup and --steps where steps take well under a millisecond."
        )
    if baseline.raw.step_source == "backward":
        notes.append(
            "No torch.optim optimizer was built, so each backward() ended a training step (a loop "
            "that updates its parameters by hand); call trainadvisor.step() to mark steps yourself."
        )
    notes.append(input_note(baseline))
    diagnosis = rulebook.diagnose(named_measurements(baseline), rules)
    plan = fixes.plan(diagnosis.findings, diagnosis.values)
    if options.only_fixes:
        named = ", ".join(options.only_fixes)
        plan = [
            p if p.fix in options.only_fixes or not p.applicable
            else replace(p, applicable=False, reason=f"not measured in this run: --fix named only {named}")
            for p in plan
        ]  # fmt: skip
    return _Diagnosed(
        baseline, diagnosis, plan, [note for note in notes if note], content=file_digest(options.script)
    )


def _with_sites(
    options: ProfileOptions, rules: list[rulebook.Rule], diagnosed: _Diagnosed, echo: Echo
) -> _Diagnosed:
    """When a finding names lines of code, the baseline's trace measurements gain the call sites
    of a separate run traced with Python stacks, and the findings are made again (the plan
    stays: call sites change what a finding shows, not what it proposes)."""
    baseline = diagnosed.baseline
    findings = diagnosed.diagnosis.findings
    if not any(f.rule in SITE_RULES for f in findings) or baseline.raw.status == "script_failed":
        return diagnosed
    sites = _call_sites(options, baseline, echo)
    if not sites:
        return diagnosed
    baseline = replace(baseline, trace={**baseline.trace, **sites})
    note = (
        "The lines named for syncs and host-made tensors come from a separate run of "
        f"{SITE_STEPS} steps traced with Python stacks (traces/sites/), kept apart because "
        "the Python tracer slows the host."
    )
    diagnosis = rulebook.diagnose(named_measurements(baseline), rules)
    return replace(diagnosed, baseline=baseline, diagnosis=diagnosis, details=[*diagnosed.details, note])


def _why_no_fixes(options: ProfileOptions, baseline: Run) -> str | None:
    if baseline.raw.status == "script_failed" and not rescue.died_of_oom(baseline.raw):
        return "The script failed, so no fix was tried."  # out of memory: its fixes are tried
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
    tuning: Tuning | None = None,
) -> ProfileReport:
    notes = [*(extra_notes or []), *(tuning.notes if tuning else [])]
    notes += window_notes(diagnosed.baseline, outcomes, after)
    notes += disturbance_notes(diagnosed.baseline, outcomes, after)
    notes.append(masked_note(mask_arguments(options.args)[1]))
    details = [baseline_note(diagnosed.baseline.raw), *(tuning.details if tuning else [])]
    details.append(_modes_note(outcomes))
    baseline, content = diagnosed.baseline, diagnosed.content
    return ProfileReport(
        schema_version=SCHEMA_VERSION,
        run_id=run_id(content, options.args, baseline.raw.device, max(1, len(baseline.ranks))),
        content_digest=content,
        workload=options.workload,
        command=reproduce_command(options),
        script=str(options.script),
        environment=diagnosed.baseline.raw.device,
        baseline=diagnosed.baseline,
        findings=fixes.with_claims(diagnosed.diagnosis.findings, outcomes),
        after=after,
        plan=diagnosed.plan,
        fix_outcomes=outcomes,
        applied_fixes=[o.fix for o in outcomes if o.status == "kept"],
        # the headline's: a comparison whose fixes were not kept (inconclusive, no gain) has none
        speedup=comparison.speedup if comparison and any(o.status == "kept" for o in outcomes) else None,
        comparison=comparison,
        notes=[*diagnosed.notes, *(n for n in notes if n)],
        elapsed_s=time.monotonic() - started,
        loss_noise_rel=noise_rel,
        trial_windows=list(tuning.windows) if tuning else [],
        details=[*diagnosed.details, *(d for d in details if d)],
    )


def _modes_note(outcomes: list[FixOutcome]) -> str | None:
    """How the trials ran where some restarted the script: which fixes in windows of the
    baseline's process, which in fresh runs, and why (windows alone: the bracket's note and the
    windows' table say so)."""
    windows = [o.fix for o in outcomes if o.mode == "in_process"]
    restarted = [
        f"{o.fix} ({o.mode_reason})" if o.mode_reason else o.fix for o in outcomes if o.mode == "restart"
    ]
    if not restarted:
        return None
    parts = []
    if windows:
        parts.append(
            f"measured in windows of the baseline's own process, without restarting it: {', '.join(windows)}"
        )
    if restarted:
        parts.append(f"measured in fresh runs of the script: {'; '.join(restarted)}")
    return ("Trials " + "; trials ".join(parts) + ".") if parts else None


def _confirm(
    options: ProfileOptions,
    diagnosed: _Diagnosed,
    started: float,
    tuning: Tuning,
    noise_rel: float | None,
    echo: Echo,
    prestarted: Prestarted | None = None,
    adjacent: Callable[[], Run | None] | None = None,
) -> ProfileReport:
    """The confirmation stage (`confirm`), and the report of the whole run."""
    done = confirm(options, diagnosed.baseline, tuning, noise_rel, echo, prestarted, adjacent)
    return _report(
        options, diagnosed, started, done.outcomes, done.after, done.comparison, done.notes, noise_rel, tuning
    )
