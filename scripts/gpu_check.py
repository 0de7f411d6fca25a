"""Check trainadvisor on a GPU: profile every example, read each report, print a table.

    bash scripts/gpu_check.sh [--out DIR] [--only NAME] [--record-traces]

For each example it checks what a GPU run must show: the expected finding, every proposed fix
either kept or refused with a stated reason (never a crashed trial), and training unchanged by
what was kept. It is what anyone with a GPU runs first: a user, a CI runner, or this project.
Exit codes: 0 every check held; 1 a check failed; 2 no CUDA GPU (nothing can be checked here).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
# A trial that crashed is a defect; any other outcome is an honest verdict with its reason.
HONEST = {"kept", "recommended", "no_gain", "not_applicable", "refused", "changed_training"}


@dataclass
class Check:
    name: str
    script: str
    args: list[str]
    findings: list[str]  # rules that must fire
    options: list[str] = field(default_factory=list)  # trainadvisor profile options
    min_gpus: int = 1


GPU = ["--device", "cuda"]
CHECKS = [
    Check("slow-input", "slow_input_mnist.py", ["--epochs", "1", "--samples", "20000", *GPU], ["data-stall"]),
    Check("host-tensors", "host_tensors.py", ["--epochs", "1", *GPU], ["cpu-tensor-creation", "host-sync"]),
    Check("small-batch", "small_batch.py", ["--epochs", "1", *GPU], ["gpu-underutilized", "launch-bound"]),
    Check("anomaly", "small_batch.py", ["--epochs", "1", "--detect-anomaly", *GPU], ["anomaly-detection-on"]),
    Check("fp32-matmul", "fp32_matmul.py", ["--epochs", "1", *GPU], ["no-mixed-precision"]),
    Check("memory-limit", "memory_limit.py", ["--memory-fraction", "0.9", *GPU], ["memory-pressure"]),
    Check(
        "ddp-straggler",
        "ddp_train.py",
        ["--epochs", "1", "--slow-rank", "1"],
        ["straggler"],
        options=["--nproc-per-node", "2"],
        min_gpus=2,
    ),  # fmt: skip
]


def judge(check: Check, exit_code: int, report: dict[str, Any] | None) -> tuple[bool, list[str]]:
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
    return not problems, problems


def row(check: Check, report: dict[str, Any] | None, problems: list[str]) -> list[str]:
    fired = ", ".join(f["rule"] for f in (report or {}).get("findings", [])) or "-"
    fixes = ", ".join(f"{o['fix']}: {o['status']}" for o in (report or {}).get("fix_outcomes", [])) or "-"
    speedup = (report or {}).get("speedup")
    return [
        check.name,
        fired,
        fixes,
        f"{speedup:.2f}x" if speedup else "-",
        "PASS" if not problems else "FAIL: " + "; ".join(problems),
    ]


def run(check: Check, out: Path) -> tuple[int, dict[str, Any] | None]:
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
        passed, problems = judge(check, code, report)
        failed += not passed
        rows.append(row(check, report, problems))
    print(table(rows))
    if args.record_traces:
        record_traces(args.out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
