"""Acceptance run on a GPU: profile the bundled examples, then check in each report what only a
GPU produces and the verdicts a GPU owner should get.

    python3 scripts/gpu_check.py [--out DIR] [--group GROUP ...] [--only NAME ...] [--list] [--record-traces]

The whole run takes more than one 10-minute device command: run it a group at a time (`--list`
names them: input, precision, batch, compile, memory, multi; each a few minutes).

Runs from the source tree, offline (`python3 -m trainadvisor`; nothing is downloaded). For each
example it checks:
- GPU facts: NVML sampled the GPU in the baseline window, every timed step has a GPU time (CUDA
  events), CUDA memory statistics were read, the baseline trace holds kernels and host-to-device
  copies, and each fix's switch was visibly in effect in its trial windows (bf16 outputs under
  autocast, the TF32 flag on, pinned batches copied without blocking);
- the expected findings and verdicts: slow input keeps dataloader-workers, with NVML's energy per
  step; the fp32 matmul model keeps amp with a large gain of its own, its MFU within (0, 100]%
  against its dtype's peak and its memory of one step adding up to its peak; the small batch
  shows the batch-size opportunity in its headline; the reduce-overhead compiled model (its loss
  computed inside the compiled function, a CUDA graph output) has every seeded step's loss;
  `--fix compile` on the eager model measures compiling with its compile time; the deep blocks
  under a 30 MB budget keep or recommend activation checkpointing within it; the model sized
  to 1.3x the GPU's memory runs out of it and a fix that fits is kept or recommended;
- honesty: every proposed fix kept, recommended, shown as an opportunity or refused with a
  stated reason (never a crashed trial), and training unchanged by what was kept.
Exit codes: 0 every check held; 1 a check failed; 2 no CUDA GPU (nothing can be checked here).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
# A trial that crashed is a defect; any other outcome is an honest verdict with its reason.
HONEST = {
    "kept",
    "recommended",
    "no_gain",
    "not_applicable",
    "refused",
    "changed_training",
    "opportunity",
    "redundant",
}
Report = dict[str, Any]
Verdict = Callable[[Report], list[str]]  # the problems found in a report ([]: it holds)


def kept(fix: str, min_gain: float = 1.05) -> Verdict:
    """The fix is kept, with a gain of its own trial of at least `min_gain`."""

    def check(report: Report) -> list[str]:
        outcome = _outcome(report, fix)
        if outcome is None or outcome["status"] != "kept":
            status = outcome["status"] if outcome else "not proposed"
            return [f"{fix} was not kept ({status}: {(outcome or {}).get('reason', '')})"]
        if (outcome.get("gain") or 0.0) < min_gain:
            return [f"{fix} was kept with a gain of its own of {outcome.get('gain')}, less than {min_gain}x"]
        return []

    return check


def opportunity(fix: str) -> Verdict:
    """The fix is measured as an opportunity, and the headline says so."""

    def check(report: Report) -> list[str]:
        outcome = _outcome(report, fix)
        if outcome is None or outcome["status"] != "opportunity":
            return [f"{fix} is not an opportunity ({(outcome or {}).get('status', 'not proposed')})"]
        if "opportunity" not in _headline(report):
            return [f"the headline does not name the {fix} opportunity"]
        return []

    return check


def every_loss_read(report: Report) -> list[str]:
    """The baseline recorded the loss of every timed step (CUDA graphs overwrite a view)."""
    steps = [s for s in report["baseline"]["raw"]["steps"] if not s["profiled"]]
    missing = [s["index"] for s in steps if s.get("loss") is None]
    return (
        [f"no loss recorded for {len(missing)} of {len(steps)} timed steps"] if missing or not steps else []
    )


def mfu_measured(report: Report) -> list[str]:
    """MFU taken from counted FLOPs against a datasheet peak of the step's dtype, within (0, 100]%."""
    use = report["baseline"].get("utilization") or {}
    mfu = use.get("mfu_pct")
    if mfu is None:
        return [f"no MFU ({use.get('status')})"]
    problems = [] if 0 < mfu <= 100 else [f"MFU {mfu:.1f}% is outside (0, 100]"]
    return problems + ([] if use.get("peak_dtype") else ["the MFU's peak names no dtype"])


def energy_measured(report: Report) -> list[str]:
    """NVML's energy counter read over the timed steps: joules per step and per sample."""
    energy = report["baseline"].get("energy") or {}
    if not energy.get("energy_j") or not energy.get("j_per_step"):
        return [f"no energy measured ({energy.get('method')}: {energy.get('reason')})"]
    return []


def memory_step_adds_up(report: Report) -> list[str]:
    """The memory of one step measured on the GPU, its parts adding up to its peak (within 10%)."""
    memory = report["baseline"].get("memory") or {}
    peak, parts = memory.get("peak_bytes") or 0, memory.get("breakdown") or {}
    if not memory.get("status", "").startswith("measured") or not peak:
        return [f"no memory of one step ({memory.get('status')})"]
    total = sum(parts.values())
    return [] if abs(total - peak) <= 0.1 * peak else [f"the step's parts add up to {total} of {peak} bytes"]


def compile_measured(report: Report) -> list[str]:
    """`compile` measured with its compile time and, where it gained, its break-even."""
    outcome = _outcome(report, "compile")
    if outcome is None:
        return ["compile was not proposed"]
    measured = [t for t in outcome.get("trials", []) if t.get("status") == "measured"]
    if not measured:
        return [f"no compile trial was measured ({outcome['status']}: {outcome.get('reason')})"]
    if outcome.get("compile_s") is None:
        return [f"compile is {outcome['status']} without its compile time"]
    return []


def fits_budget(fix: str) -> Verdict:
    """The fix kept or recommended, its trial's peak within the run's memory budget."""

    def check(report: Report) -> list[str]:
        outcome = _outcome(report, fix)
        if outcome is None or outcome["status"] not in ("kept", "recommended"):
            return [f"{fix} is not kept or recommended ({(outcome or {}).get('status', 'not proposed')})"]
        budget = (report["baseline"].get("memory") or {}).get("budget_bytes")
        peak = outcome.get("peak_bytes")
        if budget and peak and peak > budget:
            return [f"{fix}'s peak {peak} bytes is over the budget of {budget}"]
        return []

    return check


def rescued(report: Report) -> list[str]:
    """The script ran out of memory, and a fix that lets it run is kept or recommended."""
    fixes = report.get("fix_outcomes", [])
    if not any(o["status"] in ("kept", "recommended") for o in fixes):
        tried = ", ".join(f"{o['fix']}: {o['status']}" for o in fixes) or "none proposed"
        return [f"no fix let the script run within the memory ({tried})"]
    return []


@dataclass
class Check:
    name: str
    script: str
    args: list[str]
    findings: list[str]  # rules that must fire
    verdicts: list[Verdict] = field(default_factory=list)
    options: list[str] = field(default_factory=list)  # trainadvisor profile options
    min_gpus: int = 1
    group: str = ""  # checks run together as one command of a few minutes (`--group`)
    # about what it takes on an H100 or H200; on an H200 (2026-11-30) fp32-matmul took 111 s and
    # compile-fix 60-75 s, and slow-input and host-tensors ran past 185 s and 120 s (estimated)
    minutes: float = 2.0


GPU = ["--device", "cuda"]
# Sized so that every window fits at H100 speed (hundreds of steps per second); grouped so that
# each group is one device command of a few minutes (the whole is more than one 10-minute call).
CHECKS = [
    Check("slow-input", "slow_input_mnist.py", ["--samples", "60000", *GPU], ["data-stall"],
          [kept("dataloader-workers", 3.0), energy_measured], group="input", minutes=4.0),
    Check("host-tensors", "host_tensors.py", ["--epochs", "4", *GPU], ["cpu-tensor-creation", "host-sync"],
          group="input", minutes=4.0),
    Check("fp32-matmul", "fp32_matmul.py", ["--epochs", "40", *GPU], ["no-mixed-precision"],
          [kept("amp", 1.3), mfu_measured, memory_step_adds_up], group="precision", minutes=2.0),
    Check("anomaly", "small_batch.py", ["--epochs", "2", "--detect-anomaly", *GPU], ["anomaly-detection-on"],
          group="precision", minutes=1.5),
    Check("small-batch", "small_batch.py", ["--epochs", "4", *GPU], ["gpu-underutilized", "host-bound"],
          [opportunity("batch-size")], group="batch", minutes=3.0),
    Check("compiled", "compiled_step.py", ["--compile", "reduce-overhead", "--epochs", "20", *GPU], [],
          [every_loss_read], group="compile", minutes=2.0),
    Check("compile-fix", "compiled_step.py", ["--compile", "none", "--epochs", "40", *GPU], [],
          [compile_measured], options=["--fix", "compile"], group="compile", minutes=1.5),
    Check("memory-limit", "memory_limit.py", ["--memory-fraction", "0.9", *GPU], ["memory-pressure"],
          [memory_step_adds_up], group="memory", minutes=2.0),
    Check("checkpointing", "deep_blocks.py", ["--epochs", "40", *GPU], ["over-memory-budget"],
          [fits_budget("activation-checkpointing")], options=["--memory-budget", "30MB"], group="memory",
          minutes=2.0),
    Check("oom-rescue", "memory_limit.py", ["--memory-fraction", "1.3", *GPU], ["out-of-memory"], [rescued],
          group="memory", minutes=2.5),
    Check("ddp-straggler", "ddp_train.py", ["--epochs", "1", "--slow-rank", "1"], ["straggler"],
          options=["--nproc-per-node", "2"], min_gpus=2, group="multi", minutes=2.0),
]  # fmt: skip


def _outcome(report: Report, fix: str) -> dict[str, Any] | None:
    return next((o for o in report.get("fix_outcomes", []) if o["fix"] == fix), None)


def _headline(report: Report) -> str:
    from trainadvisor._serial import from_plain
    from trainadvisor.records import Report as Saved
    from trainadvisor.report.render import headline

    return headline(from_plain(Saved, report))


def gpu_facts(report: Report, folder: Path) -> list[str]:
    """What a GPU run must show: NVML samples, GPU times, CUDA memory, kernels and copies in
    the baseline trace, and each switch in effect in its trials."""
    raw = report["baseline"]["raw"]
    problems = []
    if not raw.get("nvml_status", "").startswith("sampled") or not raw.get("gpu_samples"):
        problems.append(f"NVML: {raw.get('nvml_status')} ({len(raw.get('gpu_samples') or [])} samples)")
    timed = [s for s in raw["steps"] if not s["profiled"]]
    no_gpu_time = [s["index"] for s in timed if s.get("gpu_ms") is None]
    if not timed or no_gpu_time:
        problems.append(f"{len(no_gpu_time)} of {len(timed)} timed steps have no GPU time")
    memory = (raw.get("runtime") or {}).get("cuda_memory") or {}
    if not memory.get("peak_allocated_bytes"):
        problems.append("no CUDA memory statistics in the baseline window")
    problems += _trace_facts(raw, folder)
    for outcome in report.get("fix_outcomes", []):
        for trial in outcome.get("trials", []):
            problems += switch_problems(outcome["fix"], trial)
    return problems


def _trace_facts(raw: dict[str, Any], folder: Path) -> list[str]:
    from trainadvisor.analyze.trace.analysis import analyze_trace

    if not raw.get("trace_file") or not (folder / raw["trace_file"]).is_file():
        return ["no baseline trace"]
    analysis = analyze_trace(folder / raw["trace_file"])
    problems = [] if analysis.kernels else ["no GPU kernel in the baseline trace"]
    copies = sum(s.h2d_pageable + s.h2d_pinned + s.h2d_unknown for s in analysis.steps)
    return problems + ([] if copies else ["no host-to-device copy in the baseline trace"])


def switch_problems(fix: str, trial: dict[str, Any]) -> list[str]:
    """Whether a measured trial window ran with its fix's switch on, from what the window read
    in the training process: the flags, and the switches' own counts of what they did."""
    raw = trial.get("raw") or {}
    if trial.get("status") != "measured" or not raw:
        return []
    runtime = raw.get("runtime") or {}
    switched = runtime.get("switched") or {}
    overrides = trial.get("overrides") or {}
    where = f"{fix}'s trial {trial['label']}"
    problems = []
    if overrides.get("runtime", {}).get("amp") and not switched.get("autocast_outputs"):
        problems.append(f"{where}: no module output came back from autocast in low precision")
    if overrides.get("runtime", {}).get("tf32") and not runtime.get("tf32_enabled"):
        problems.append(f"{where}: TF32 was off in the window")
    if overrides.get("non_blocking_h2d") and not switched.get("non_blocking_copies"):
        problems.append(f"{where}: no pinned batch was copied without blocking")
    return problems


def judge(
    check: Check, exit_code: int, report: Report | None, folder: Path | None = None
) -> tuple[bool, list[str]]:
    """(passed, problems) of one example's report."""
    if report is None:
        return False, [f"no report (profile exited {exit_code})"]
    problems = [] if exit_code == 0 else [f"profile exited {exit_code}"]
    fired = {f["rule"] for f in report.get("findings", [])}
    problems += [f"{rule} did not fire" for rule in check.findings if rule not in fired]
    for outcome in report.get("fix_outcomes", []):
        if outcome["status"] not in HONEST or not outcome.get("reason"):
            problems.append(
                f"fix {outcome['fix']}: {outcome['status']} ({outcome.get('reason') or 'no reason'})"
            )
    loss = (report.get("comparison") or {}).get("loss_check") or {}
    if loss.get("equivalent") is False:
        problems.append("the kept fixes changed training")
    for verdict in check.verdicts:
        problems += verdict(report)
    if folder is not None:
        problems += gpu_facts(report, folder)
    return not problems, problems


def row(check: Check, report: Report | None, problems: list[str]) -> list[str]:
    fired = ", ".join(f["rule"] for f in (report or {}).get("findings", [])) or "-"
    fixes = ", ".join(f"{o['fix']}: {o['status']}" for o in (report or {}).get("fix_outcomes", [])) or "-"
    speedup = (report or {}).get("speedup")
    unit = ((report or {}).get("comparison") or {}).get("unit", "")
    return [
        check.name,
        fired,
        fixes,
        f"{speedup:.2f}x {unit}" if speedup else "-",
        "PASS" if not problems else "FAIL: " + "; ".join(problems),
    ]


def run(check: Check, out: Path) -> tuple[int, Report | None]:
    folder = out / check.name
    shutil.rmtree(folder, ignore_errors=True)
    command = [
        sys.executable, "-m", "trainadvisor", "profile", "--out", str(folder), *check.options,
        str(EXAMPLES / check.script), *check.args,
    ]  # fmt: skip
    with open(out / f"{check.name}.log", "w") as log:
        code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT).returncode
    path = folder / "report.json"
    return code, json.loads(path.read_text()) if path.is_file() else None


def table(rows: list[list[str]]) -> str:
    head = ["example", "findings", "fixes", "speedup", "verdict"]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = [" | ".join(c.ljust(w) for c, w in zip(r, widths)) for r in [head, *rows]]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def record_traces(out: Path) -> None:
    """The baseline traces of the single-GPU examples, for tests/data/own/ (see its SOURCE.md)."""
    target = ROOT / "tests" / "data" / "own"
    for check in CHECKS:
        trace = out / check.name / "traces" / "baseline" / "trainadvisor.pt.trace.json.gz"
        if trace.is_file() and check.min_gpus == 1:
            shutil.copy(trace, target / f"{check.name.replace('-', '_')}_cuda.pt.trace.json.gz")
            print(f"recorded {target / (check.name.replace('-', '_') + '_cuda.pt.trace.json.gz')}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "gpu-check", help="report folders and logs")
    parser.add_argument("--only", action="append", help="run only these checks (by name)")
    parser.add_argument(
        "--group", action="append", choices=sorted({c.group for c in CHECKS}),
        help="run only these groups of checks (each one device command of a few minutes)",
    )  # fmt: skip
    parser.add_argument("--list", action="store_true", help="list the checks, their groups and minutes")
    parser.add_argument("--record-traces", action="store_true", help="copy baseline traces to tests/data/own")
    args = parser.parse_args()
    if args.list:
        for check in CHECKS:
            print(f"{check.group:<10} {check.name:<14} about {check.minutes:g} min on an H100 or H200")
        return 0
    sys.path.insert(0, str(ROOT))  # the source tree's trainadvisor, for reading the reports
    import torch

    if not torch.cuda.is_available():
        print(
            "gpu_check: no CUDA GPU is visible to this Python (torch.cuda.is_available() is False, "
            f"torch {torch.__version__}); run it where a GPU and a CUDA build of torch are installed",
            file=sys.stderr,
        )
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    gpus = torch.cuda.device_count()
    print(f"gpu_check: {torch.cuda.get_device_name(0)} x{gpus}, torch {torch.__version__}", flush=True)
    rows, failed = [], 0
    for check in CHECKS:
        if (args.only and check.name not in args.only) or (args.group and check.group not in args.group):
            continue
        if gpus < check.min_gpus:
            rows.append([check.name, "-", "-", "-", f"SKIPPED: needs {check.min_gpus} GPUs"])
            continue
        print(f"gpu_check: profiling {check.name} ...", flush=True)
        code, report = run(check, args.out)
        passed, problems = judge(check, code, report, args.out / check.name)
        failed += not passed
        rows.append(row(check, report, problems))
        print(f"gpu_check: {check.name}: {'PASS' if passed else 'FAIL: ' + '; '.join(problems)}", flush=True)
    print(table(rows))
    if args.record_traces:
        record_traces(args.out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
