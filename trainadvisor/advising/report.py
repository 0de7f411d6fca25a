"""The report `@advise` writes from its window: the rules over what it measured, and for each
fix the `trainadvisor profile` command that measures it (or its trial windows' outcome, see
`advise_trials`)."""

from __future__ import annotations

import gc
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainadvisor import fixes, rulebook
from trainadvisor.analyze.run.summary import attach_trace, input_note, named_measurements, summarize
from trainadvisor.frameworks import vocab
from trainadvisor.profile.runs import ProfileOptions, reproduce_command
from trainadvisor.records import SCHEMA_VERSION, FixOutcome, Overrides, ProfileReport, RawRun
from trainadvisor.records.identity import content_digest, file_digest, run_id
from trainadvisor.redact import mask_arguments, masked_note

_NO_SCRIPT = "restart the training from a script to measure it with `trainadvisor profile`"


def main_script() -> Path | None:
    """The script this process runs (None in a notebook)."""
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    return Path(main_file) if main_file and str(main_file).endswith(".py") else None


def advise_report(
    raw: RawRun,
    traces_in: Path,
    rule_dirs: list[Path],
    started: float,
    command_for: Callable[[Path | None], list[str] | None],
    called: str = "@advise",  # how the script asked for the advisor (`Advisor.called`)
) -> tuple[ProfileReport, dict[str, Any]]:
    """The report of the advisor's window, and the measurements the rules saw; its trace is
    read under `traces_in` (the writer's staging folder, until the report is published)."""
    script = main_script()
    trace = attach_trace(raw, traces_in, script)
    run = summarize(raw)
    run.trace = trace
    diagnosis = rulebook.diagnose(named_measurements(run), rulebook.rules_for(rule_dirs))
    plan = fixes.plan(diagnosis.findings, diagnosis.values)
    command = command_for(script)
    restart = f"measure it with: {shlex.join(command)}" if command else _NO_SCRIPT
    framework = str(diagnosis.values.get("framework", ""))
    outcomes = [
        FixOutcome(
            p.fix, p.rule, "needs_restart" if p.applicable else "not_applicable",
            restart if p.applicable else p.reason, Overrides(), [],
            setting_change=vocab.where_set(p.fix, framework),
        )
        for p in plan
    ]  # fmt: skip
    notes = [
        f"Measured in-process by {called}: fixes are not applied here. `trainadvisor profile` "
        "reruns the script with each fix and measures it before and after."
    ]
    masked = masked_note(mask_arguments(sys.argv[1:])[1]) if command else None
    notes += [note for note in (input_note(run), masked) if note]
    content = file_digest(script) if script else content_digest(called)
    report = ProfileReport(
        schema_version=SCHEMA_VERSION,
        run_id=run_id(content, sys.argv[1:], raw.device, max(1, len(raw.ranks))),
        content_digest=content,
        command=command or [called],
        script=str(script) if script else "<in-process>",
        environment=raw.device,
        baseline=run,
        findings=diagnosis.findings,
        plan=plan,
        fix_outcomes=outcomes,
        notes=notes,
        elapsed_s=time.monotonic() - started,
    )
    return report, diagnosis.values


def profile_command(
    script: Path | None, out: Path, warmup: int, steps: int, rule_dirs: list[Path]
) -> list[str] | None:
    """The `trainadvisor profile` command that measures the fixes, writing beside this
    report rather than over it."""
    if script is None or not script.is_file():
        return None
    options = ProfileOptions(
        script=script,
        args=sys.argv[1:],
        out_dir=out.with_name(out.name + "-profile"),
        warmup=warmup,
        steps=steps,
        rule_dirs=rule_dirs,
    )
    return reproduce_command(options)


def data_parallel_modules() -> int:
    """nn.DataParallel modules over two or more GPUs that exist now (the window's facts, as
    profile's child counts those built): looked up once, when the timed steps begin."""
    parallel = torch.nn.DataParallel
    # type(), not isinstance(): isinstance asks an object's __class__, which some objects compute
    found = [obj for obj in gc.get_objects() if issubclass(type(obj), parallel)]
    return sum(1 for module in found if len(module.device_ids or []) >= 2)
