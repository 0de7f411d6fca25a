"""Every command's options, each defined once: its flag, type, default, help and who receives it.

From these tables come click's decorators (`decorators`), the values of `profile`'s options
record (`record_values`, `default`), which options every run of the script and the user's own
process receive (`receiving`), the command that repeats a run (`repeated`) and the docs' CLI
reference (`scripts/gen_docs.py`). `tests/integration/test_options.py` fails where one of those places has an
option its table lacks, or lacks one the table has."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import click

from trainadvisor.measure.settle import MAX_WARMUP_S, MIN_TIME_S
from trainadvisor.options.kinds import DURATION, DURATION_OR_ZERO, SIZE, Finite, Seconds

# Who receives an option beyond the command itself: "run", every run of the script (its
# `RunSpec`); "child", the user's process too (its `ChildConfig`); "window", each window's size
# (time floor and warm-up, `measure.config.WindowSize`); "torchrun", the launcher's options.
Receiver = Literal["run", "child", "window", "torchrun"]


def _number(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _seconds(value: Any) -> str:
    return f"{value:g}s"


@dataclass(frozen=True)
class Option:
    """One option of one command. `default` is the value the command receives when it is not
    given (for `invert`ed flags, the record's value: `--no-fix` absent is `apply_fixes=True`)."""

    flag: str
    dest: str
    kind: Any = None  # a click type; None: a flag
    default: Any = None
    help: str = ""
    shown: str | None = None  # the default as written on the command line ("1s"), where it differs
    multiple: bool = False
    metavar: str | None = None
    field: str | None = None  # the options record's field; None: the same as `dest`
    invert: bool = False  # a flag that switches the record's field off
    receives: tuple[Receiver, ...] = ()
    always: bool = False  # spelled out in the repeated command even at its default
    spelled: Callable[[Any], str] = _number  # how the repeated command writes a value

    @property
    def is_flag(self) -> bool:
        return self.kind is None

    @property
    def record_field(self) -> str:
        return self.field or self.dest

    def decorator(self) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        if self.is_flag:
            return click.option(self.flag, self.dest, is_flag=True, help=self.help)
        given = self.shown if self.shown is not None else self.default  # click converts "1s" to 1.0
        return click.option(
            self.flag,
            self.dest,
            type=self.kind,
            default=given if not self.multiple else (),
            show_default=given is not None,
            multiple=self.multiple,
            metavar=self.metavar,
            help=self.help,
        )

    def record_value(self, given: Any) -> Any:
        """What the options record holds for what click parsed."""
        if self.invert:
            return not given
        return list(given) if self.multiple else given

    def argv(self, value: Any) -> list[str]:
        """The value as the repeated command writes it; nothing where it is the default."""
        if self.multiple:
            return [part for item in value for part in (self.flag, self.spelled(item))]
        if value is None or (value == self.default and not self.always):
            return []
        if self.is_flag:
            return [self.flag]
        return [self.flag, self.spelled(value)]


def out_option(help_text: str, default: str | None = "trainadvisor-report") -> Option:
    return Option(
        "--out",
        "out_dir",
        click.Path(file_okay=False, path_type=Path),
        default,
        help_text + (" A folder of yours that is not a report is never written into." if default else ""),
        always=True,
        spelled=str,
    )


RULES = Option(
    "--rules",
    "rule_dirs",
    click.Path(exists=True, file_okay=False, path_type=Path),
    help="A folder of extra rule files (*.toml); may be given several times; a rule with a "
    "built-in id replaces the built-in rule.",
    multiple=True,
    spelled=str,
)


FORMATS = ("terminal", "markdown", "json", "sarif")
TRACKERS = ("wandb", "mlflow", "tensorboard")  # the experiment trackers (`trackers`)


def format_option(what: str, document: str = "the report", findings: str = "its findings") -> Option:
    """--format: what goes to stdout (the report folder is written whatever it is)."""
    return Option(
        "--format", "output_format", click.Choice(FORMATS), "terminal",
        f"What to print on stdout: terminal, {what}; markdown, {document} as Markdown (a pull-request "
        f"comment); json, {document} as JSON, and nothing else; sarif, SARIF 2.1.0 of {findings} that "
        "name a line of code (code scanning on the diff). Progress and errors go to stderr.",
        spelled=str,
    )  # fmt: skip


WORKLOAD = Option(
    "--workload", "workload", str, None,
    "A name for what this run trains (e.g. resnet50-imagenet), kept in the report: `compare` "
    "refuses to gate two reports of different workloads, and accepts two of one workload whose "
    "scripts differ (a pull request that edits the training script).",
    spelled=str,
)  # fmt: skip


def _launcher(flag: str, kind: Any, help_text: str) -> Option:
    """One of torchrun's own options, handed to it as written."""
    dest = flag.removeprefix("--").replace("-", "_")
    return Option(flag, dest, kind, None, f"torchrun: {help_text}", receives=("torchrun",))


PROFILE: tuple[Option, ...] = (
    Option(
        "--warmup", "warmup", click.IntRange(min=1), 5,
        "Training steps to run at least before timing (compilation, caches, worker start-up); the "
        "warm-up then goes on until step time settles (consecutive blocks of steps agree to 10%).",
        receives=("run", "child"), always=True,
    ),
    Option(
        "--steps", "steps", click.IntRange(min=2), 20,
        "Training steps to time at least (then 10 more are traced with torch.profiler).",
        receives=("run", "child"), always=True,
    ),
    Option(
        "--min-time", "min_time_s", DURATION_OR_ZERO, MIN_TIME_S,
        "Every timed window lasts at least this long (at GPU speed 20 steps are a few ms), within "
        "the steps the script has; 0: exactly --steps steps.",
        shown=_seconds(MIN_TIME_S), receives=("window",), spelled=_seconds,
    ),
    Option(
        "--max-warmup", "max_warmup_s", DURATION_OR_ZERO, MAX_WARMUP_S,
        "The longest a warm-up may wait for step time to settle; a window measured unsettled is "
        "named in the report. 0: exactly --warmup steps, no steadiness test.",
        shown=_seconds(MAX_WARMUP_S), receives=("window",), spelled=_seconds,
    ),
    Option(
        "--memory-budget", "memory_budget_bytes", SIZE, None,
        "The memory the run may use (24GB, 500MiB): a peak above it is diagnosed as not fitting, "
        "though it did not crash (on a CPU: will it fit on that card?). On a GPU the default is what "
        "the allocator may use.",
        receives=("run",),
    ),
    Option(
        "--max-workers", "max_workers", click.IntRange(min=1), None,
        "The most DataLoader workers the search may try above the script's own count (the processes "
        "a job may start on a shared node). Default: it doubles up to four per core, and on to 64 "
        "while the workers mostly wait (storage or network latency) and their memory fits.",
    ),
    out_option("Report folder: report.html, report.md, report.json and the raw traces."),
    RULES,
    format_option("the diagnosis in a dozen lines"),
    WORKLOAD,
    Option(
        "--log-to", "log_to", click.Choice(TRACKERS), None,
        "Log the verdict into an experiment tracker too (repeatable): its metrics, findings and "
        "report files, in the run WANDB_RUN_ID / MLFLOW_RUN_ID names (the training's), else a run "
        "of its own; TensorBoard into TRAINADVISOR_TENSORBOARD_DIR, else the report folder. A "
        "tracker that fails says so in one line; the profile goes on.",
        multiple=True, spelled=str,
    ),
    Option(
        "--run-to-end", "run_to_end", default=False,
        help="Let the script finish after the profiled window instead of stopping it.",
    ),
    Option(
        "--no-fix", "no_fix", default=True, field="apply_fixes", invert=True,
        help="Only diagnose: do not rerun the script with fixes applied.",
    ),
    Option(
        "--seed", "seed", int, 0,
        "Seed for random, torch and numpy before the script starts, the same in every run, so the "
        "loss of the same steps can be compared.",
        receives=("run", "child"), always=True,
    ),
    Option(
        "--timeout", "timeout_s", Seconds(min=1), None,
        "Seconds a run may take before it is stopped (a hung rank under torchrun ends here).",
        receives=("run",),
    ),
    Option(
        "--stall-timeout", "stall_s", Seconds(min=1), None,
        "Seconds without a training step after which a run counts as stuck (a deadlocked worker, "
        "a collective waiting forever): it is stopped and the report shows where each process was "
        "(Python stacks). Default: 20x the longest gap between steps or batches seen, at least 600 s.",
        receives=("run",),
    ),
    Option(
        "--budget", "budget_s", DURATION, None,
        "The most all trials may take, e.g. 10m, 90s or 1h: fixes are tried most-to-gain first, "
        "and those left are listed with the command that measures them.",
        spelled=_seconds,
    ),
    Option(
        "--fix", "only_fixes", str, None,
        "Measure only this fix (repeatable), e.g. --fix dataloader-workers.",
        multiple=True, metavar="ID", spelled=str,
    ),
    Option(
        "--trials", "trials", click.Choice(["auto", "restart"]), "auto",
        "auto: try settings that can switch while the loop runs (DataLoader workers, TF32, bf16 "
        "autocast, ...) in windows of the first run, without restarting the script; restart: every "
        "candidate in a fresh run.",
        spelled=str,
    ),
    Option(
        "--nproc-per-node", "nproc_per_node", click.IntRange(min=1), None,
        "Launch SCRIPT through torch.distributed.run (torchrun) with this many processes per node; "
        "every rank is profiled and the report compares them.",
        receives=("torchrun",),
    ),
    _launcher("--nnodes", str, "number of nodes (or MIN:MAX)."),
    _launcher("--node-rank", int, "this node's rank."),
    _launcher("--rdzv-endpoint", str, "rendezvous host:port."),
    _launcher("--rdzv-backend", str, "rendezvous backend (c10d, static, ...)."),
    _launcher("--rdzv-id", str, "job id shared by every node."),
    _launcher("--master-addr", str, "address of the rank-0 node (static rendezvous)."),
    _launcher("--master-port", int, "port on the rank-0 node (static rendezvous)."),
)  # fmt: skip


ANALYZE: tuple[Option, ...] = (
    out_option("Report folder: report.html, report.md and report.json."),
    RULES,
    format_option("the diagnosis per trace, or the rank table"),
    Option(
        "--json", "as_json", default=False, help="The same as --format json (kept for scripts that use it)."
    ),
    WORKLOAD,
    Option(
        "--engine", "engine", click.Choice(["local", "ray"]), "local",
        "Where each trace is analysed: `local`, on this machine's cores; `ray`, one Ray task per "
        "trace, each reading its own file where it is, only the summaries sent back (pip install "
        "'trainadvisor[ray]').",
    ),
    Option(
        "--address", "address", str, None,
        "With --engine ray: the Ray cluster to join (HOST:PORT of the head node; default "
        "RAY_ADDRESS). Without either, a local Ray is started for the run.",
    ),
)  # fmt: skip


REPORT: tuple[Option, ...] = (
    out_option("Write the report here instead of into DIR (needed with several DIRs).", default=None),
    RULES,
    format_option("the diagnosis in a dozen lines"),
)


EXPORT: tuple[Option, ...] = (
    Option(
        "--to", "to", click.Choice(TRACKERS), None,
        "The tracker to log the report into (repeatable): wandb, mlflow or tensorboard.",
        multiple=True, spelled=str,
    ),
)  # fmt: skip


STORE = Option(
    "--store", "store", str, None,
    "Where baselines are kept: a folder, or an object-store URL (s3://bucket/prefix). Default: "
    "$TRAINADVISOR_BASELINES, else ~/.local/share/trainadvisor/baselines.",
    spelled=str,
)  # fmt: skip

METRICS = ("step_time", "samples_per_s", "peak_memory", "mfu", "energy_per_sample")

COMPARE: tuple[Option, ...] = (
    Option(
        "--gate", "gate_pct", Finite(min=0), 5.0,
        "The smallest change, in percent, that matters: a head worse by more than this, beyond the "
        "runs' own noise, is regression_likely (exit 1); one within it either way is neutral.",
    ),
    Option(
        "--max-regression", "max_regression", Finite(min=0), None,
        "The same as --gate (kept for scripts that use it).",
    ),
    Option(
        "--metric", "metric", click.Choice(METRICS), "step_time",
        "What the gate reads: step_time (of the timed steps), samples_per_s, peak_memory, mfu or "
        "energy_per_sample; every metric both reports measured is shown whichever it is.",
        spelled=str,
    ),
    Option(
        "--strict", "strict", default=False,
        help="Fail (exit 1) on an inconclusive verdict too: runs too noisy, too short or not comparable.",
    ),
    Option(
        "--against", "against", str, None,
        "The base to compare HEAD with, as baseline:NAME (a report saved with `trainadvisor baseline "
        "save`); then only HEAD is given.",
        metavar="baseline:NAME", spelled=str,
    ),
    STORE,
    format_option("the verdict and a table of the metrics", "the comparison", "HEAD's findings"),
    Option(
        "--run", "which", click.Choice(["baseline", "after"]), "baseline",
        "Compare each report's first run (the code as it is) or its run with the kept fixes.",
    ),
)  # fmt: skip


BASELINE_SAVE: tuple[Option, ...] = (STORE,)
BASELINE_LIST: tuple[Option, ...] = (STORE,)
BASELINE_DELETE: tuple[Option, ...] = (STORE,)


TABLES: dict[str, tuple[Option, ...]] = {
    "profile": PROFILE,
    "analyze": ANALYZE,
    "report": REPORT,
    "compare": COMPARE,
    "mcp": (),
    "export": EXPORT,
    "baseline save": BASELINE_SAVE,
    "baseline list": BASELINE_LIST,
    "baseline delete": BASELINE_DELETE,
}


def decorators(table: Sequence[Option]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """click's options of a command, in the table's order (as `--help` lists them)."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(table):
            command = option.decorator()(command)
        return command

    return decorate


def receiving(receiver: Receiver, table: Sequence[Option] = PROFILE) -> tuple[str, ...]:
    """The record fields of the options that `receiver` receives."""
    return tuple(o.record_field for o in table if receiver in o.receives)


def record_options(table: Sequence[Option] = PROFILE) -> tuple[Option, ...]:
    """The options the command's options record holds as fields (torchrun's are held as one
    list of the launcher's own arguments)."""
    return tuple(o for o in table if "torchrun" not in o.receives)


def record_values(params: dict[str, Any], table: Sequence[Option] = PROFILE) -> dict[str, Any]:
    """The options record's fields from what click parsed."""
    return {o.record_field: o.record_value(params[o.dest]) for o in record_options(table)}


def default(field: str, table: Sequence[Option] = PROFILE) -> Any:
    """The default of a record field, as the table defines it (the options record, `@advise`
    and the docs take theirs from here)."""
    for option in table:
        if option.record_field == field:
            return option.default
    raise KeyError(field)


def repeated(record: Any, table: Iterable[Option] = PROFILE) -> list[str]:
    """The options that repeat `record`: those always spelled out first (the window's size, the
    folder, the seed), then each one that differs from its default, in the table's order."""
    options = sorted(record_options(tuple(table)), key=lambda o: not o.always)
    return [part for o in options for part in o.argv(getattr(record, o.record_field))]


def torchrun_argv(params: dict[str, Any], table: Sequence[Option] = PROFILE) -> list[str]:
    """torch.distributed.run's options as given (`params`: what click parsed, by parameter name),
    in its own spelling; none: no torchrun. A single node without rendezvous options gets
    --standalone (a free local port)."""
    launcher = [o for o in table if "torchrun" in o.receives and o.dest != "nproc_per_node"]
    given = [[o.flag, str(params[o.dest])] for o in launcher if params.get(o.dest) is not None]
    nproc_per_node = params.get("nproc_per_node")
    if nproc_per_node is None and not given:
        return []
    options = ["--nproc-per-node", str(nproc_per_node or 1), *(part for pair in given for part in pair)]
    return options if given else [*options, "--standalone"]
