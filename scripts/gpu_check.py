"""Acceptance run on a GPU: profile the bundled examples, then check in each report what only a
GPU produces and the verdicts a GPU owner should get.

    python3 scripts/gpu_check.py [--out DIR] [--only NAME ...] [--record-traces]

Runs from the source tree, offline (`python3 -m trainadvisor`; nothing is downloaded). For each
example it checks:
- GPU facts: NVML sampled the GPU in the baseline window, every timed step has a GPU time (CUDA
  events), CUDA memory statistics were read, the baseline trace holds kernels and host-to-device
  copies, and each fix's switch was visibly in effect in its trial windows (bf16 outputs under
  autocast, the TF32 flag on, pinned batches copied without blocking);
- the expected findings and verdicts: slow input keeps dataloader-workers; the fp32 matmul model
  keeps amp with a large gain of its own; the small batch shows the batch-size opportunity in
  its headline; the reduce-overhead compiled model's report has every seeded step's loss;
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


@dataclass
class Check:
    name: str
    script: str
    args: list[str]
    findings: list[str]  # rules that must fire
    verdicts: list[Verdict] = field(default_factory=list)
    options: list[str] = field(default_factory=list)  # trainadvisor profile options
    min_gpus: int = 1


GPU = ["--device", "cuda"]
# Sized so that every window fits at H100 speed (hundreds of steps per second).
CHECKS = [
    Check("slow-input", "slow_input_mnist.py", ["--samples", "60000", *GPU], ["data-stall"],
          [kept("dataloader-workers", 3.0)]),
    Check("fp32-matmul", "fp32_matmul.py", ["--epochs", "40", *GPU], ["no-mixed-precision"],
          [kept("amp", 1.3)]),
    Check("small-batch", "small_batch.py", ["--epochs", "4", *GPU], ["gpu-underutilized", "host-bound"],
          [opportunity("batch-size")]),
    Check("host-tensors", "host_tensors.py", ["--epochs", "4", *GPU], ["cpu-tensor-creation", "host-sync"]),
    Check("anomaly", "small_batch.py", ["--epochs", "2", "--detect-anomaly", *GPU], ["anomaly-detection-on"]),
    Check("compiled", "compiled_step.py", ["--compile", "reduce-overhead", "--epochs", "20", *GPU], [],
          [every_loss_read]),
    Check("memory-limit", "memory_limit.py", ["--memory-fraction", "0.9", *GPU], ["memory-pressure"]),
    Check("ddp-straggler", "ddp_train.py", ["--epochs", "1", "--slow-rank", "1"], ["straggler"],
          options=["--nproc-per-node", "2"], min_gpus=2),
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
    from trainadvisor.analyze.kineto import analyze_trace

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
    parser.add_argument("--only", action="append", help="run only these examples (by name)")
    parser.add_argument("--record-traces", action="store_true", help="copy baseline traces to tests/data/own")
    args = parser.parse_args()
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
        if args.only and check.name not in args.only:
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
