"""The `trainadvisor` command line.

May import: profile, analyze, report, options, measure (signals noted where they arrive), records,
resources, _version, errors."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import click

from trainadvisor._version import __version__
from trainadvisor.cli import exits
from trainadvisor.errors import ScriptFailedError, Terminated, TrainAdvisorError, UsageError
from trainadvisor.options import table
from trainadvisor.options.kinds import TraceLocation
from trainadvisor.records import Report
from trainadvisor.records.upgrade import UnreadableVersion
from trainadvisor.report.mdtext import terminal
from trainadvisor.report.render import terminal_summary, write_report
from trainadvisor.resources import templates_dir


def _echo(message: str, err: bool = True) -> None:
    """Every line trainadvisor writes to the terminal (JSON aside): what it quotes of others
    (file names, object keys, a script's exception) shown, never acted on (`mdtext.terminal`)."""
    click.echo(terminal(message), err=err)


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
    _run(lambda: _profile(options))


def _profile(options: Any) -> int:
    """`profile` with each stage's report written as it finishes; interrupted, the last one is
    kept and says so (`profile.command.profile`). A signal is noted where it arrives and acted
    on where the run checks for it (`measure.interrupts`): a clean-up run from inside the code
    it interrupted could wait forever for a lock held there."""
    from trainadvisor.measure import interrupts
    from trainadvisor.profile.command import profile

    out_dir = options.out_dir

    def save(report: Report, publish: Callable[[], None]) -> None:
        write_report(report, out_dir, templates_dir(), publish)

    with interrupts.noted_only():
        report = profile(options, _echo, save)
        interrupts.check()  # one that came after the run's last check: the exit says so
    _echo(terminal_summary(report, out_dir), err=False)
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
    as_json: bool,
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
      trainadvisor analyze --json trace_rank*.json.gz > report.json
      trainadvisor analyze s3://my-bucket/runs/42/traces/
    """
    from trainadvisor.analyze.command import analyze as run_analysis
    from trainadvisor.analyze.engines import engine_for
    from trainadvisor.report.analyze import analysis_summary
    from trainadvisor.report.folder import hold_out_dir
    from trainadvisor.report.render import report_json

    def work() -> int:
        with hold_out_dir(out_dir):  # from the start: a busy folder is refused before the reading
            report, analyses = run_analysis(
                list(paths),
                list(rule_dirs),
                ["trainadvisor", "analyze", *map(str, paths)],
                engine_for(engine, address),
            )
            write_report(report, out_dir, templates_dir())
        if as_json:
            click.echo(report_json(report), nl=False)
        else:
            _echo(analysis_summary(report, analyses, out_dir), err=False)
        return 0

    _run(work)


def _run(work: Callable[[], int]) -> NoReturn:
    """The one error boundary of every command: trainadvisor's own errors as one line with
    their exit code; a file that cannot be read or written (no space left, a folder that is a
    file) as a usage problem; Ctrl-C as 130; a defect of ours as one line and exit 1, its
    traceback with TRAINADVISOR_DEBUG=1."""
    # SIGINT too: a shell starting a background job, or a scheduler, may have set it to be
    # ignored, and a `kill -INT` to this process alone must still stop the run.
    previous = {
        signal.SIGTERM: signal.signal(signal.SIGTERM, _terminate),
        signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler),
    }
    try:
        code = work()
    except TrainAdvisorError as exc:
        _echo(f"trainadvisor: error: {exc}")
        sys.exit(exc.exit_code)
    except (KeyboardInterrupt, Terminated) as exc:
        click.echo("trainadvisor: interrupted; the script and its workers were stopped", err=True)
        sys.exit(128 + getattr(exc, "signum", signal.SIGINT))
    except OSError as exc:
        where = f" {exc.filename}" if exc.filename else ""
        _echo(
            f"trainadvisor: error: {exc.strerror or exc} while writing or reading{where}; free space, "
            "fix the permissions or choose another --out"
        )
        sys.exit(UsageError.exit_code)
    except Exception as exc:  # a defect of ours: one line for the user, the details on request
        if os.environ.get("TRAINADVISOR_DEBUG"):
            raise
        _echo(
            f"trainadvisor: internal error: {type(exc).__name__}: {exc}. Please report it; "
            "set TRAINADVISOR_DEBUG=1 to see the traceback."
        )
        sys.exit(1)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    sys.exit(code)


def _terminate(signum: int, _frame: object) -> None:
    raise Terminated(signum)


def _load(path: Path) -> Any:
    """A saved report: its folder or its report.json."""
    from trainadvisor.report.render import load_report

    folder = path.parent if path.name == "report.json" else path
    if not (folder / "report.json").is_file():
        raise UsageError(f"{path}: no report.json here; give a report folder written by trainadvisor")
    try:
        return load_report(folder)
    except UnreadableVersion as exc:
        raise UsageError(f"{folder / 'report.json'}: {exc}") from None
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise UsageError(f"{folder / 'report.json'}: not a report this version can read ({exc})") from None


@main.command(epilog=exits.REPORT)
@table.decorators(table.REPORT)
@click.argument("folders", metavar="DIR...", nargs=-1, required=True, type=click.Path(path_type=Path))
def report(out_dir: Path | None, rule_dirs: tuple[Path, ...], folders: tuple[Path, ...]) -> None:
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

        dirs = [f.parent if f.name == "report.json" else f for f in folders]
        if len(dirs) > 1 and out_dir is None:
            raise UsageError("several report folders are merged into one: give --out for it")
        if len({d.resolve() for d in dirs}) < len(dirs):
            raise UsageError("a report folder was given twice")
        saved = _load(dirs[0]) if len(dirs) == 1 else merge_reports([_load(d) for d in dirs], list(rule_dirs))
        target = out_dir or dirs[0]
        with hold_out_dir(target, "--out" if out_dir is not None else ""):
            # in its own folder, report.json stays as saved (an earlier version's, maybe)
            write_report(saved, target, templates_dir(), with_json=out_dir is not None or len(dirs) > 1)
        _echo(terminal_summary(saved, target), err=False)
        return 0

    _run(work)


@main.command(epilog=exits.COMPARE)
@table.decorators(table.COMPARE)
@click.argument("base", type=click.Path(path_type=Path))
@click.argument("head", type=click.Path(path_type=Path))
def compare(max_regression: float, output: str, which: str, base: Path, head: Path) -> None:
    """Compare two saved reports (folders or report.json files): every metric's change, the
    noise of the runs' own windows, and a gate on throughput for CI.

    A throughput drop counts as a regression only when it is larger than --max-regression and
    larger than the window-to-window spread of the runs.

    \b
    Example (profile both commits with --no-fix, then):
      trainadvisor compare base-report/ head-report/ --max-regression 5
    """

    def work() -> int:
        from trainadvisor.report.compare import compare_reports, comparison_json, comparison_markdown

        try:
            result = compare_reports(_load(base), _load(head), max_regression, which)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        click.echo(comparison_json(result) if output == "json" else comparison_markdown(result), nl=False)
        return 1 if result.regressed else 0

    _run(work)


if __name__ == "__main__":
    main()
