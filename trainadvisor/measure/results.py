"""What a run's child saved, read back once it has ended (`runner.collect`): its result, or,
where it wrote no last word, what it saved as it went (`journal`); under torchrun every rank's,
the lowest rank's run carrying them, and the rank that failed first named."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from trainadvisor import _serial
from trainadvisor.errors import UsageError
from trainadvisor.measure import journal
from trainadvisor.measure.config import failed_write_file
from trainadvisor.measure.spec import RunSpec
from trainadvisor.records import RawRun
from trainadvisor.redact import Secrets
from trainadvisor.units import signal_name


def local_ranks(torchrun: list[str]) -> int:
    """The ranks of a single-node run (--nproc-per-node), 0 when not known: on several nodes
    this node's global ranks depend on the rendezvous."""
    if any(option in ("--nnodes", "--node-rank") for option in torchrun):
        return 0
    for i, option in enumerate(torchrun[:-1]):
        if option in ("--nproc-per-node", "--nproc_per_node") and torchrun[i + 1].isdigit():
            return int(torchrun[i + 1])
    return 0


def read_ranks(
    result_file: Path, spec: RunSpec, returncode: int, killed: str | None, heartbeat: Path, ours: bool
) -> RawRun:
    """Every rank's result (by the rank in the file name; or what a rank that ended without a
    word saved as it went); the lowest rank's run carries them. The run fails when any rank
    failed, naming the first failed rank and its error."""
    runs, ranks = [], set()
    for written in (result_file, journal.progress_file(result_file)):
        for path in written.parent.glob(written.name.replace("{rank}", "*")):
            number = path.name.removeprefix(f"{spec.label}.rank").split(".")[0]
            ranks.update([int(number)] if number.isdigit() else [])
    for rank in sorted(ranks):
        mine = [Path(str(path).replace("{rank}", str(rank))) for path in (result_file, heartbeat)]
        run = read_result(mine[0], spec, returncode, killed, mine[1], ours)
        run.rank = rank
        runs.append(run)
    runs.sort(key=lambda r: r.rank or 0)
    if not runs:
        first = read_result(result_file, spec, returncode, killed)  # no rank wrote anything
        first.error = f"{first.error} (torchrun: no rank recorded a result)"
        return first
    primary = runs[0]
    primary.ranks = [replace(r, ranks=[]) for r in runs]
    failures = [r for r in runs if r.status == "script_failed"]
    if killed:
        # Stopped by the timeout: the hung rank is the one that got least far; the others wait
        # for it inside backward() (the gradient all-reduce).
        failures.sort(key=lambda r: (r.steps_seen, "before its backward" not in (r.error or "")))
    else:
        # The first rank to fail is the cause; the others fail after it (a closed connection).
        failures.sort(key=lambda r: r.ended_unix_s or float("inf"))
    failed = failures[0] if failures else None
    silent = [str(rank) for rank in range(local_ranks(spec.torchrun)) if rank not in {r.rank for r in runs}]
    if failed is not None:
        waiting = [str(r.rank) for r in failures[1:] if "inside backward" in (r.error or "")]
        primary.status, primary.error = "script_failed", f"rank {failed.rank}: {failed.error}"
        if killed and waiting:
            primary.error += f"; rank {', '.join(waiting)} waited for it inside backward() (the all-reduce)"
        if killed and silent:
            primary.error += (
                f"; rank {', '.join(silent)} did not respond (blocked, waiting for rank {failed.rank})"
            )
    elif killed and silent:
        primary.status = "script_failed"
        primary.error = f"{killed}; rank {', '.join(silent)} recorded nothing"
    elif returncode != 0 and primary.status != "window_complete":
        primary.status = "script_failed"
        primary.error = killed or f"torchrun ended with exit code {returncode}"
    return primary


def _raise_if_disk_full(reason: str, result_file: Path) -> None:
    """A child that could not write its measurements for want of space (its word for it is a
    UsageError's message, or nothing at all when not even that fitted) ends the run: the user's
    next step is to free space, not to debug the script."""
    if reason.startswith(f"{UsageError.__name__}: "):
        raise UsageError(reason.removeprefix(f"{UsageError.__name__}: "))
    if not reason:
        raise UsageError(
            f"no space left on device while writing {result_file} (not even the reason could be "
            "written); free space or choose another --out"
        )


def load_result(result_file: Path, spec: RunSpec) -> RawRun:
    """What the child saved, the script's credentials masked in the file first (its errors
    quote what the script's exception said)."""
    Secrets.of(spec.args).json_file(result_file)
    return _serial.load_json(RawRun, result_file)


def read_result(
    result_file: Path,
    spec: RunSpec,
    returncode: int,
    killed: str | None,
    heartbeat: Path | None = None,
    ours: bool = False,
) -> RawRun:
    """The run as its child recorded it. A child that wrote no last word (it ended at os._exit,
    or was SIGKILLed: `progress`) leaves the window as far as it got and its step count; its end
    is then told by its exit status, unless trainadvisor itself stopped it (`killed`, `ours`)."""
    raw = load_result(result_file, spec) if result_file.exists() else None
    failed_write = failed_write_file(result_file)
    if (raw is None or raw.exit_code is None) and not failed_write.exists():
        saved = journal.progress_file(result_file)
        if raw is None and saved.exists():
            Secrets.of(spec.args).json_file(saved)
        raw = journal.last_known(raw, result_file, heartbeat, spec.label)
        if raw is not None and not killed and not ours:
            journal.say_how_it_ended(raw, returncode, "torchrun" if spec.torchrun else None)
    if raw is not None:
        if killed and raw.status != "window_complete":
            # keep how far the child says it got when it was stopped
            note = raw.error if raw.error and raw.error.startswith("stopped by trainadvisor") else None
            raw.status, raw.error = "script_failed", f"{killed}; {note}" if note else killed
        return raw
    if killed:
        error = killed
    elif failed_write.exists():
        Secrets.of(spec.args).file(failed_write)
        reason = failed_write.read_text().strip()
        _raise_if_disk_full(reason, result_file)
        error = (
            f"trainadvisor could not save the measurements in the script's process "
            f"({reason}); the script's own exit code was {returncode}"
        )
    elif returncode < 0:
        error = f"the script was killed by signal {signal_name(-returncode)}"
    else:
        error = f"the script ended with exit code {returncode} before anything was recorded"
    return RawRun(
        label=spec.label,
        status="script_failed",
        exit_code=returncode,
        error=error,
        warmup_steps=spec.warmup,
        window_steps=spec.steps,
        profile_steps=0,
        steps_seen=0,
        steps=[],
        loaders=[],
        device=None,
    )
