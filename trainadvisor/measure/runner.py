"""Runs the user's script once in a child process under instrumentation and returns what it
measured. The child gets its own process group, so when it ends every DataLoader worker and
any process it started goes with it; a process that left the group, and any process of the run
once trainadvisor itself has ended, however it ended, is the run's guard's to end
(`measure.reaper`)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from trainadvisor.measure import console, interrupts, reaper
from trainadvisor.measure.config import ChildConfig, failed_write_file, save_config
from trainadvisor.measure.nvml import Stamped
from trainadvisor.measure.results import read_ranks, read_result
from trainadvisor.measure.sampling import Sampler
from trainadvisor.measure.spec import PROFILE_STEPS as PROFILE_STEPS
from trainadvisor.measure.spec import RunSpec
from trainadvisor.measure.watchdog import Watchdog
from trainadvisor.records import Overrides, RawRun
from trainadvisor.redact import Secrets

# Once the window is written, the script is given this long to stop before it is killed
# (a loop that catches BaseException would otherwise keep training).
STOP_GRACE_S = 15.0

_HELD = (signal.SIGINT, signal.SIGTERM)


def _child_env() -> dict[str, str]:
    """The user's environment; this package's folder is appended to PYTHONPATH (after the user's
    entries, so it never changes which copy of a module their script imports)."""
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[2])  # the folder trainadvisor/ is in
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), package_root) if p)
    return env


def _run_env(spec: RunSpec, token: str) -> dict[str, str]:
    """The child's environment, marked with the run's token (`reaper`); and, where the kernel's
    parent-death signal can be relied on, the pid it is to die with."""
    env = _child_env()
    env[reaper.RUN_ENV] = token
    env.pop(reaper.PARENT_ENV, None)
    if not spec.torchrun and threading.current_thread() is threading.main_thread():
        env[reaper.PARENT_ENV] = str(os.getpid())
    return env


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM put off until the block ends (then handled as they would have been):
    starting and stopping a child are not interrupted halfway, which would leave a child no one
    stops. Their handlers are swapped rather than the signal mask, which a child would inherit."""
    if threading.current_thread() is not threading.main_thread() or interrupts.active():
        yield  # only the main thread receives signals; `interrupts`' handlers only take a note
        return
    received: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, _frame: received.append(signum)) for sig in _HELD}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        if received:
            signal.raise_signal(received[0])


def _own_group() -> dict[str, Any]:
    """A process group of the child's own (what `stop` and the guard end, and what a Ctrl-C to
    trainadvisor's spares), in trainadvisor's session: where the kernel groups threads by
    session for scheduling (Linux's autogroup), a session of its own is scheduled as a whole
    against the caller's, which `python SCRIPT` run in its place is not. Beside a process that
    kept one of 2 cores busy, the example's loop ran 7 steps/s in a session of its own (its
    second torch thread waiting out the busy process's turns) and 45 run by itself, and 88 either
    way on one thread. Python 3.10 has no `process_group`: a session of its own there."""
    return {"process_group": 0} if sys.version_info >= (3, 11) else {"start_new_session": True}


def _group_alive(proc: subprocess.Popen[bytes]) -> bool:
    proc.poll()  # reap the leader if it has exited, so its zombie does not count as alive
    try:
        os.killpg(proc.pid, 0)
    except ProcessLookupError:
        return False
    return True


def _stop_group(proc: subprocess.Popen[bytes], token: str | None = None) -> None:
    """End the child's whole process group, and the run's processes outside it (`reaper`):
    SIGTERM, then SIGKILL what is left after 2 s."""
    for sig, wait_s in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)):
        strays = reaper.strays(token, proc.pid) if token is not None else []
        group = _group_alive(proc)
        if not group and not strays:
            return
        family = reaper.family(proc.pid) if proc.poll() is None else []  # once reaped, its pid may be reused
        reaper.unlower(family + strays)  # a lowered run acts on the signal at once
        if group:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
        reaper.signal_all(strays, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and (_group_alive(proc) or reaper.running(strays)):
            time.sleep(0.02)


def wait_for(
    proc: subprocess.Popen[bytes],
    spec: RunSpec,
    result_files: list[Path],
    watchdog: Watchdog,
    done: Callable[[], bool] | None = None,
) -> str | None:
    """Wait for the child (or until `done()`: it may still be exiting then); returns why it was
    killed, or None. With several ranks, the grace period starts when the first rank has written
    its window."""
    started = time.monotonic()
    written_at: float | None = None
    while proc.poll() is None:
        if done is not None and done():
            return None
        interrupts.pause(0.05)  # where a signal to trainadvisor is acted on
        now = time.monotonic()
        stuck = watchdog.stalled(now)
        if stuck is not None:
            _stop_group(proc)
            return stuck
        if spec.stop_after_window and written_at is None and _written(result_files):
            written_at = now
        if written_at is not None and now - written_at > STOP_GRACE_S:
            _stop_group(proc)
            return f"the script kept running {STOP_GRACE_S:.0f} s after it was asked to stop"
        if spec.timeout_s is not None and now - started > spec.timeout_s:
            _stop_group(proc)
            return f"the run took longer than {spec.timeout_s:.0f} s"
    return None


def _written(result_files: list[Path]) -> bool:
    """A result, or word that it could not be written (a full disk), is there."""
    candidates = [*result_files, *map(failed_write_file, result_files)]
    return any(p.exists() if "*" not in p.name else any(p.parent.glob(p.name)) for p in candidates)


@dataclass
class _Files:
    """Where one run's child writes: its result, the GPU it trains on, its trace (`{rank}` in
    their names under torchrun), and its log when its output is not shown."""

    result: Path
    device: Path
    trace_rel: str | None  # relative to the report folder
    log_rel: str | None
    heartbeat: Path
    stacks: Path  # where each process was, if it got stuck (copied to logs/ then)


# What a child writes in .work/, each named `{label}[.rank{rank}].{kind}`.
_WRITTEN = ("result.json", "result.json.error", "progress.json", "device.json", "heartbeat", "stacks.txt")


def _prepare_files(spec: RunSpec) -> _Files:
    """The run's file names, with whatever an earlier run of the same label left removed."""
    work = spec.out_dir / ".work"
    work.mkdir(parents=True, exist_ok=True)
    suffix = ".rank{rank}" if spec.torchrun else ""
    for kind in _WRITTEN:
        for stale in work.glob(f"{spec.label}*.{kind}"):
            stale.unlink()
    trace_rel = f"traces/{spec.label}/trainadvisor{suffix}.pt.trace.json.gz" if spec.profile else None
    if trace_rel:
        (spec.out_dir / trace_rel).parent.mkdir(parents=True, exist_ok=True)
        for stale in (spec.out_dir / trace_rel).parent.glob("trainadvisor*.pt.trace.json.gz"):
            stale.unlink()  # left by an earlier report here
    log_rel = None if spec.show_output else f"logs/{spec.label}.log"
    if log_rel:
        (spec.out_dir / log_rel).parent.mkdir(parents=True, exist_ok=True)
    return _Files(
        work / f"{spec.label}{suffix}.result.json",
        work / f"{spec.label}{suffix}.device.json",
        trace_rel,
        log_rel,
        work / f"{spec.label}{suffix}.heartbeat",
        work / f"{spec.label}{suffix}.stacks.txt",
    )


def measures_memory(profile: bool, overrides: Overrides) -> bool:
    """Whether a run measures one untimed step's memory after its timed ones: a trial does (its
    peak), unless its model is compiled (a dispatch mode around compiled code would recompile
    it); a traced run has the profiler's memory instead."""
    return not profile and "compile" not in overrides.runtime


def _command(spec: RunSpec, files: _Files) -> list[str]:
    """`python -m trainadvisor.training.child CONFIG SCRIPT ARGS`, through torchrun when asked
    (torchrun's own process then starts the ranks, each running the child module)."""
    config = ChildConfig(
        label=spec.label,
        result_file=str(files.result.resolve()),
        trace_file=str((spec.out_dir / files.trace_rel).resolve()) if files.trace_rel else None,
        warmup=spec.warmup,
        steps=spec.steps,
        profile_steps=min(spec.profile_steps, spec.steps) if spec.profile else 0,
        stop_after_window=spec.stop_after_window,
        seed=spec.seed,
        overrides=spec.overrides,
        with_stack=spec.with_stack,
        device_file=str(files.device.resolve()),
        session_dir=str(spec.session_dir.resolve()) if spec.session_dir else None,
        gate_file=str(spec.gate_file.resolve()) if spec.gate_file else None,
        heartbeat_file=str(files.heartbeat.resolve()),
        stacks_file=str(files.stacks.resolve()),
        size=spec.size,
        memory_step=measures_memory(spec.profile, spec.overrides),
        cpu_peak_file=str((files.result.parent / "cpu-peak.json").resolve()),
    )
    config_file = files.result.parent / f"{spec.label}.config.json"
    save_config(config, config_file)
    command = [sys.executable, "-m", "trainadvisor.training.child", str(config_file), str(spec.script)]
    if spec.torchrun:
        command = [sys.executable, "-m", "torch.distributed.run", *spec.torchrun, "--module", *command[2:]]
    return [*command, *spec.args]


@dataclass
class Launched:
    """A child started for one run: its process, the sampler watching it, where it writes."""

    proc: subprocess.Popen[bytes]
    sampler: Sampler
    files: _Files
    log: console.CappedLog | None
    started: float
    watchdog: Watchdog
    forwarder: threading.Thread | None = None  # the script's stderr, without Kineto's chatter
    secrets: Secrets = field(default_factory=Secrets)  # the script's credentials, masked in its log
    token: str | None = None  # in the environment of every process of the run (`reaper`)
    guard: reaper.Guard | None = None  # ends the run's processes once trainadvisor's has ended
    printed: threading.Thread | None = None  # the script's stdout, into its (capped) log
    stopped_running: bool = False  # `stop` ended it: its exit status is trainadvisor's doing


def launch(spec: RunSpec) -> Launched:
    """Start the run's guard, then the child (signals held: a Ctrl-C now would leave a child no
    one stops)."""
    interrupts.check()  # a signal noted since the last check: nothing more is started
    files = _prepare_files(spec)
    command = _command(spec, files)
    log = console.CappedLog(spec.out_dir / files.log_rel) if files.log_rel else None
    errors_to = log or getattr(sys.stderr, "buffer", None)  # None under a capture without bytes
    token, guard = reaper.new_token(), None
    try:
        with _signals_held():
            guard = reaper.Guard(token, _child_env())
            proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE if log is not None else None,  # capped on its way to the log
                stderr=subprocess.PIPE if errors_to is not None else None,
                env=_run_env(spec, token),
                **_own_group(),
            )
            guard.watch(proc.pid)
            interrupts.track(proc.pid)
            forwarder = console.forward(proc.stderr, errors_to) if proc.stderr and errors_to else None
            printed = console.forward(proc.stdout, log, filtered=False) if proc.stdout and log else None
            sampler = Sampler(proc.pid, devices=_named_devices(files.device))
            sampler.start()
    except BaseException:
        if guard is not None:
            guard.close()  # and with it whatever was started
        if log:
            log.close()
        raise
    watchdog = Watchdog(
        [_any_rank(files.heartbeat)], [_any_rank(files.stacks)], spec.out_dir / "logs", spec.stall_s
    )
    return Launched(
        proc, sampler, files, log, time.monotonic(), watchdog, forwarder, Secrets.of(spec.args), token, guard,
        printed,
    )  # fmt: skip


def _any_rank(path: Path) -> Path:
    return path.with_name(path.name.replace("{rank}", "*"))


def stop(launched: Launched) -> None:
    """End the child's whole group and the sampling; signals held, so stopping finishes even
    when a signal interrupts the wait before it."""
    try:
        with _signals_held():
            launched.sampler.stop()
            launched.stopped_running = launched.proc.poll() is None
            # DataLoader workers or anything else the script left running, in its group or not
            _stop_group(launched.proc, launched.token)
            launched.proc.wait()
            interrupts.untrack(launched.proc.pid)
            if launched.guard is not None:
                launched.guard.close()
            for thread in (launched.forwarder, launched.printed):  # the last lines, unless an
                if thread is not None:  # escaped process holds the pipe
                    thread.join(timeout=2.0)
    finally:
        if launched.log:
            with contextlib.suppress(OSError):  # a full disk: the log keeps what it took
                launched.log.close()
            launched.secrets.file(Path(launched.log.name))  # what the script printed of them


def collect(launched: Launched, spec: RunSpec, killed: str | None) -> RawRun:
    """What the stopped child recorded, with the parent's own measurements added."""
    files = launched.files
    gather = read_ranks if spec.torchrun else read_result
    ended = (launched.proc.returncode, killed, files.heartbeat, launched.stopped_running)
    raw = gather(files.result, spec, *ended)
    raw.wall_s, raw.log_file, raw.overrides = (
        time.monotonic() - launched.started,
        files.log_rel,
        spec.overrides,
    )
    attach_samples(raw, launched.sampler)
    for run in [raw, *raw.ranks]:
        if run.trace_file and files.trace_rel:
            run.trace_file = files.trace_rel.replace("{rank}", str(run.rank if run.rank is not None else 0))
    return raw


def measure(spec: RunSpec) -> RawRun:
    """Run the script once; never raises for the script's own failures (they are in the result).
    Under torchrun every rank writes its own result and trace (`{rank}` in their names); the
    run returned is the lowest rank's, with every rank's in `ranks`."""
    launched = launch(spec)
    try:
        result = launched.files.result
        killed = wait_for(launched.proc, spec, [_any_rank(result)], launched.watchdog)
    finally:
        stop(launched)
    return collect(launched, spec, killed)


def _named_devices(device_file: Path) -> Callable[[], dict[str, dict[str, Any]]]:
    """The GPUs the child processes announced (`Recorder.announce_device`), by label: "GPU 0",
    or under torchrun "rank 1 (GPU 1)" (each rank's own device is sampled)."""
    pattern = device_file.name.replace("{rank}", "*")
    prefix, _, suffix = device_file.name.partition("{rank}")

    found: dict[str, dict[str, Any]] = {}
    read: set[Path] = set()  # each file is read once: called every tick while the run lasts

    def named() -> dict[str, dict[str, Any]]:
        for path in device_file.parent.glob(pattern):
            if path in read:
                continue
            try:
                identity = json.loads(path.read_text())
            except (OSError, ValueError):  # being written: read it on the next tick
                continue
            read.add(path)
            gpu = f"GPU {identity.get('index')}"
            rank = path.name.removeprefix(prefix).removesuffix(suffix) if suffix else ""
            found[f"rank {rank} ({gpu})" if rank.isdigit() else gpu] = identity
        return found

    return named


def attach_samples(
    raw: RawRun, sampler: Sampler, since_unix_s: float = 0.0, until_unix_s: float = 0.0
) -> None:
    """The sampler's readings, timed from the window's start; only those between `since` and
    `until` when given (one window of a run kept alive for trial windows)."""
    t0 = raw.window_start_unix_s
    if t0 is None:
        t0 = sampler.host[0][0] if sampler.host else 0.0
    end = until_unix_s or float("inf")

    def placed(stamped: list[Stamped[Any]]) -> list[Any]:
        return [
            replace(s, t_ms=(unix_s - t0) * 1e3)
            for unix_s, s in list(stamped)
            if since_unix_s <= unix_s <= end
        ]

    raw.host_samples = placed(sampler.host)
    raw.gpu_samples = placed(sampler.gpu)
    raw.nvml_status = sampler.status_now()
