"""The `trainadvisor` command line.

May import: profile, analyze, report, options, measure (signals noted where they arrive), records, _serial,
resources, agents (`trainadvisor mcp`), trackers, _version, errors."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from trainadvisor._version import __version__
from trainadvisor.cli import baseline_commands, exits, output
from trainadvisor.cli.boundary import echo, load, run
from trainadvisor.errors import ScriptFailedError, UsageError
from trainadvisor.options import table
from trainadvisor.options.kinds import TraceLocation
from trainadvisor.records import Report
from trainadvisor.report.paths import published
from trainadvisor.report.render import report_folder, terminal_summary, write_report
from trainadvisor.resources import templates_dir


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="trainadvisor")
def main() -> None:
    """Profile a PyTorch training loop, find what holds it back, and measure the fixes.

    \b
    Start with:
      trainadvisor profile train.py --your --script --args
    """
    from trainadvisor.measure.console import quiet_numpy_warning

    quiet_numpy_warning()


@main.command(
    "profile",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
    epilog=exits.PROFILE,
)
@table.decorators(table.PROFILE)
@click.argument("script", type=click.Path(path_type=Path))
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
def profile_command(script: Path, script_args: tuple[str, ...], **given: Any) -> None:
    """Profile SCRIPT, diagnose it, rerun it with the fixes, and write a before/after report.

    SCRIPT runs unmodified as __main__ in a child process, with SCRIPT_ARGS as its own
    arguments (options for trainadvisor go before SCRIPT). Training steps are found through
    torch.optim optimizers; a loop without one calls trainadvisor.step() once per step.

    The warm-up lasts at least WARMUP steps and until step time settles; then at least STEPS
    steps, over at least --min-time, are timed with clocks (the profiler's overhead would bias
    them) while psutil and NVML sample the process, its DataLoader workers and the GPU; 10 more
    steps are traced with torch.profiler; then the script is stopped (see --run-to-end). Where
    the script's length is known (a framework's max_steps or epochs, or a run that ended), every
    window is fitted into the steps it has.

    When a rule fires, its fix is measured (several candidate settings, the fastest kept): in
    windows of the same run where the setting can switch while the loop runs, else in fresh
    runs; fixes chosen together are also measured with and without each, and one the others
    make redundant is dropped. The choice is confirmed in one more fresh run. It is kept only if
    the confirmation run's slow windows beat the first run's fast ones, it gains at least 5%,
    and the loss of the same seeded steps is unchanged. A fix that changes what is learned (a
    larger batch) is measured and shown as an opportunity, never applied.

    \b
    Example:
      trainadvisor profile --out report/ train.py --lr 0.1 --epochs 3
    """
    from trainadvisor.profile.runs import options_from

    options = options_from({"script": script, "script_args": script_args, **given})
    run(lambda: _profile(options))


def _profile(options: Any) -> int:
    """`profile` with each stage's report written as it finishes; interrupted, the last one is
    kept and says so (`profile.command.profile`). A signal is noted where it arrives and acted
    on where the run checks for it (`measure.interrupts`): a clean-up run from inside the code
    it interrupted could wait forever for a lock held there."""
    from trainadvisor.measure import interrupts
    from trainadvisor.profile.command import profile

    out_dir = options.out_dir
    at = output.root()  # where the run started, for every stage's report

    def save(report: Report, publish: Callable[[], None]) -> None:
        write_report(published(report, at), out_dir, templates_dir(), publish)

    with output.stdout_kept_for(options.output_format), interrupts.noted_only():
        report = profile(options, echo, save)
        interrupts.check()  # one that came after the run's last check: the exit says so
    report = published(report, at)
    if options.log_to:
        _log_to(report, out_dir, options.log_to)
    output.print_as(options.output_format, report, lambda: terminal_summary(report, out_dir))
    raw = report.baseline.raw if report.baseline is not None else None
    if raw is not None and (raw.status == "script_failed" or (raw.exit_code or 0) != 0):
        found = (
            "It died of out-of-memory: the diagnosis, and the fixes tried, are"
            if raw.runtime.get("oom")
            else "What was measured before it failed is"
        )
        raise ScriptFailedError(f"{options.script} failed: {raw.error}. {found} in {out_dir / 'report.html'}")
    return 0


@main.command(epilog=exits.ANALYZE)
@table.decorators(table.ANALYZE)
@click.argument("paths", nargs=-1, required=True, type=TraceLocation())
def analyze(
    out_dir: Path,
    rule_dirs: tuple[Path, ...],
    output_format: str,
    as_json: bool,
    workload: str | None,
    engine: str,
    address: str | None,
    paths: tuple[Path | str, ...],
) -> None:
    """Analyse existing torch.profiler (Kineto) traces: PATHS are trace files (.json or
    .json.gz), folders of them (one file per rank, or tensorboard_trace_handler output) or
    archives of them (.tar, .tar.gz, .tgz, .zip), or URLs of object storage (s3://bucket/prefix/,
    gs://, hf://: every trace under the prefix, streamed; pip install 'trainadvisor[s3]').

    Each trace gets a per-step breakdown of wall time (GPU kernels, memcpy, memset,
    communication, CUDA runtime, data wait, other host work, idle), GPU busy share, Tensor Core
    share (from kernel names and, with record_shapes, the ops' input dtypes), pageable and
    pinned host-to-device copies, host syncs, allocator calls, kernel launch statistics and
    peak memory. Steps are the ProfilerStep#N markers; without them (a plain profile() block,
    torch.autograd.profiler, no prof.step()) iterations are found from optimizer steps,
    backward passes, DataLoader calls or a repeated annotation, the first set apart as warm-up.
    Several ranks give one finding per rule and a rank table naming the straggler. Inference
    traces get no training advice. Large traces are read in parts on all cores, as compact
    columns.

    \b
    Examples:
      trainadvisor analyze --out report/ ./log/resnet50/
      trainadvisor analyze --format json trace_rank*.json.gz > report.json
      trainadvisor analyze --format sarif ./log/ > trainadvisor.sarif
      trainadvisor analyze s3://my-bucket/runs/42/traces/
    """
    from trainadvisor.analyze.command import analyze as run_analysis
    from trainadvisor.analyze.engines import engine_for
    from trainadvisor.report.analyze import analysis_summary
    from trainadvisor.report.folder import hold_out_dir

    shown = "json" if as_json else output_format

    def work() -> int:
        with output.stdout_kept_for(shown), hold_out_dir(out_dir):  # a busy folder: refused before reading
            report, analyses = run_analysis(
                list(paths),
                list(rule_dirs),
                ["trainadvisor", "analyze", *map(str, paths)],
                engine_for(engine, address),
                workload,
            )
            report = published(report)
            write_report(report, out_dir, templates_dir())
        output.print_as(shown, report, lambda: analysis_summary(report, analyses, out_dir))
        return 0

    run(work)


@main.command(epilog=exits.REPORT)
@table.decorators(table.REPORT)
@click.argument("folders", metavar="DIR...", nargs=-1, required=True, type=click.Path(path_type=Path))
def report(
    out_dir: Path | None, rule_dirs: tuple[Path, ...], output_format: str, folders: tuple[Path, ...]
) -> None:
    """Re-render report.html and report.md from DIR/report.json, without rerunning anything
    (after an upgrade of trainadvisor, or with edited templates).

    With several DIRs (one per node of a multi-node torchrun job, each written by that node's
    `trainadvisor profile`), merge their ranks into one report in --out: the per-rank table, the
    slowest rank and the rules over all ranks.

    \b
    Examples:
      trainadvisor report trainadvisor-report/
      trainadvisor report --out job-report node0-report/ node1-report/
    """

    def work() -> int:
        from trainadvisor.report.folder import hold_out_dir
        from trainadvisor.report.merge import merge_reports

        dirs = [report_folder(f) for f in folders]
        if len(dirs) > 1 and out_dir is None:
            raise UsageError("several report folders are merged into one: give --out for it")
        if len({d.resolve() for d in dirs}) < len(dirs):
            raise UsageError("a report folder was given twice")
        loaded = load(dirs[0]) if len(dirs) == 1 else merge_reports([load(d) for d in dirs], list(rule_dirs))
        saved = published(loaded)
        target = out_dir or dirs[0]
        with (
            output.stdout_kept_for(output_format),
            hold_out_dir(target, "--out" if out_dir is not None else ""),
        ):
            # in its own folder, report.json stays as saved (an earlier version's, maybe)
            write_report(saved, target, templates_dir(), with_json=out_dir is not None or len(dirs) > 1)
        output.print_as(output_format, saved, lambda: terminal_summary(saved, target))
        return 0

    run(work)


@main.command(epilog=exits.COMPARE)
@table.decorators(table.COMPARE)
@click.argument("reports", metavar="[BASE] HEAD", nargs=-1, required=True, type=click.Path(path_type=Path))
def compare(
    gate_pct: float,
    max_regression: float | None,
    metric: str,
    strict: bool,
    against: str | None,
    store: str | None,
    output_format: str,
    which: str,
    reports: tuple[Path, ...],
) -> None:
    """Compare two saved reports (folders or report.json files), BASE and HEAD, or HEAD with a
    named baseline (--against baseline:NAME). First whether they are comparable (the script or
    a declared --workload, the device, the ranks, the batch size, torch, the fixes applied: a
    score and what differs), then one verdict on --metric: regression_likely,
    improvement_likely, neutral or inconclusive, from the change and its interval over the
    runs' own timed windows (never from medians alone), and every metric both measured.

    \b
    Examples (profile both commits with --no-fix, then):
      trainadvisor compare base-report/ head-report/ --gate 5
      trainadvisor compare --against baseline:main head-report/ --format markdown > comment.md
    """

    def work() -> int:
        from trainadvisor.report.compare import compare_reports, exit_code
        from trainadvisor.report.compare_text import comparison_json, comparison_markdown, comparison_terminal

        base, head = (published(report) for report in _compared(reports, against, store))
        try:
            result = compare_reports(
                base, head, max_regression if max_regression is not None else gate_pct, which, metric
            )
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if output_format == "sarif":  # the head's findings, for code scanning on its diff
            output.print_as("sarif", head, str)
        else:
            shown = {
                "terminal": comparison_terminal,
                "markdown": comparison_markdown,
                "json": comparison_json,
            }
            click.echo(shown[output_format](result), nl=False)
        return exit_code(result, strict)

    run(work)


def _compared(reports: tuple[Path, ...], against: str | None, store: str | None) -> tuple[Report, Report]:
    """(base, head) from the arguments: two reports, or --against baseline:NAME and one."""
    if against is None:
        if len(reports) != 2:
            raise UsageError("compare takes BASE and HEAD, or --against baseline:NAME and HEAD")
        return load(reports[0]), load(reports[1])
    if len(reports) != 1:
        raise UsageError("with --against, give HEAD alone")
    return baseline_commands.load_named(against, store), load(reports[0])


def _log_to(report: Report, folder: Path, backends: list[str]) -> list[str]:
    from trainadvisor import trackers
    from trainadvisor.trackers.mlflow_run import quick_failures

    quick_failures()  # this is trainadvisor's own process: a tracker that is down fails fast
    return trackers.export(report, folder, backends, echo)


@main.command(epilog=exits.EXPORT)
@table.decorators(table.EXPORT)
@click.argument("report_dir", metavar="REPORT", type=click.Path(path_type=Path))
def export(to: tuple[str, ...], report_dir: Path) -> None:
    """Log a saved report (a folder or its report.json) into experiment trackers: its summary
    metrics (trainadvisor/step_time_ms, trainadvisor/steps_per_s, ... see docs/trackers.md),
    findings, fixes, report.html and report.json.

    \b
    Examples:
      trainadvisor export trainadvisor-report/ --to mlflow     # MLFLOW_TRACKING_URI, MLFLOW_RUN_ID
      WANDB_RUN_ID=abc123 WANDB_RESUME=allow trainadvisor export report/ --to wandb
    """

    def work() -> int:
        if not to:
            raise UsageError("give at least one tracker: --to wandb, --to mlflow or --to tensorboard")
        report = published(load(report_dir))
        folder = report_folder(report_dir)
        reached = _log_to(report, folder, list(to))
        return 0 if len(reached) == len(set(to)) else 4

    run(work)


@main.command(epilog=exits.MCP)
def mcp() -> None:
    """Serve trainadvisor to a coding agent over the Model Context Protocol (stdio): tools to
    profile a script (progress notifications; cancelling stops the script and its workers),
    analyse traces, compare reports and explain a finding, each answering with a summary of at
    most 8 KB and the report's path (pip install 'trainadvisor[mcp]'). See docs/agents.md.

    \b
    Example (an MCP client's configuration):
      {"mcpServers": {"trainadvisor": {"command": "trainadvisor", "args": ["mcp"]}}}
    """

    def work() -> int:
        from trainadvisor.agents.server import serve

        serve()
        return 0

    run(work)


main.add_command(baseline_commands.baseline)


if __name__ == "__main__":
    main()
