"""Hostile processes (issue 28): however trainadvisor or the script ends, no process of the run
outlives trainadvisor; what the script measured before it died is reported, with how it died;
a signal to trainadvisor is acted on where the run checks for it, never inside the code it
interrupted. Each test ends every process it saw started, whatever its outcome (`tree`)."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import select
import signal
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from conftest import SCRIPTS, load_report

from trainadvisor.measure import priority
from trainadvisor.measure.runner import RunSpec, measure

GONE_WITHIN_S = 5.0


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class Tree:
    """Every process seen under the roots given to `watch` (polled while they run), and any
    added by hand: what the test started, and nothing else (psutil's objects know their start
    time, so a pid used again by another process is never taken for one of them)."""

    def __init__(self) -> None:
        self.seen: dict[int, psutil.Process] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def add(self, proc: psutil.Process) -> None:
        self.seen.setdefault(proc.pid, proc)

    def watch(self, pid: int) -> None:
        root = psutil.Process(pid)
        self.add(root)
        thread = threading.Thread(target=self._poll, args=(root,), daemon=True)
        thread.start()
        self._threads.append(thread)

    def _poll(self, root: psutil.Process) -> None:
        while not self._stop.is_set() and _running(root):
            self.snapshot(root)
            self._stop.wait(0.05)

    def snapshot(self, root: psutil.Process) -> None:
        with contextlib.suppress(psutil.Error):
            for proc in root.children(recursive=True):
                self.add(proc)

    def left(self, within_s: float = GONE_WITHIN_S) -> list[str]:
        """Those still running after `within_s`: each one's name, state and command line (empty
        for one whose memory the kernel is freeing as it exits)."""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline and any(map(_running, self.seen.values())):
            time.sleep(0.05)
        left = []
        for proc in self.seen.values():
            with contextlib.suppress(psutil.Error):
                if _running(proc):
                    left.append(f"{proc.name()} ({proc.status()}): {' '.join(proc.cmdline())}")
        return left

    def end(self) -> None:
        """Kill what is left: each one's process group where it leads one, then itself."""
        self._stop.set()
        for thread in self._threads:
            thread.join()
        for proc in self.seen.values():
            if not _running(proc):
                continue
            with contextlib.suppress(OSError, psutil.Error):
                if os.getpgid(proc.pid) == proc.pid:
                    os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(psutil.Error):
                proc.kill()


@pytest.fixture
def tree() -> Iterator[Tree]:
    watched = Tree()
    try:
        yield watched
    finally:
        watched.end()


def _start(
    tree: Tree, cwd: Path, *args: str | Path, python: list[str] | None = None
) -> subprocess.Popen[str]:
    """`python -m trainadvisor ARGS` (or `python`'s command with ARGS), its stderr in
    cwd/stderr.txt (a pipe would be held open by a script that outlives it)."""
    command = python or [sys.executable, "-m", "trainadvisor"]
    with open(cwd / "stderr.txt", "w") as stderr:
        proc = subprocess.Popen(
            [*command, *map(str, args)], cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=stderr, text=True,
        )  # fmt: skip
    tree.watch(proc.pid)
    return proc


def _await_file(path: Path, proc: subprocess.Popen[str], timeout_s: float = 60.0) -> str:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert proc.poll() is None, f"trainadvisor ended first: {(path.parent / 'stderr.txt').read_text()}"
        assert time.monotonic() < deadline, f"no {path.name} after {timeout_s:.0f} s"
        time.sleep(0.02)
    return path.read_text()


def _await_line(text: str, proc: subprocess.Popen[str], stderr: Path, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in stderr.read_text():
        assert proc.poll() is None, f"trainadvisor ended first: {stderr.read_text()}"
        assert time.monotonic() < deadline, f"no {text!r} after {timeout_s:.0f} s: {stderr.read_text()}"
        time.sleep(0.02)


def _escapee(pid_file: Path, tree: Tree) -> psutil.Process | None:
    """The setsid grandchild, by the pid it wrote and its command line (which names the file)."""
    try:
        proc = psutil.Process(int(pid_file.read_text()))
        mine = str(pid_file) in " ".join(proc.cmdline())
    except psutil.Error:
        return None
    if not mine:
        return None
    tree.add(proc)
    return proc


# ---- no process outlives trainadvisor ----


def test_sigkill_of_trainadvisor_during_start_up_ends_the_script(tmp_path: Path, tree: Tree) -> None:
    pid_file = tmp_path / "script.pid"
    proc = _start(tree, tmp_path, "profile", "--out", tmp_path / "r", SCRIPTS / "starts_slowly.py", pid_file)
    script = psutil.Process(int(_await_file(pid_file, proc)))
    tree.add(script)
    tree.snapshot(psutil.Process(proc.pid))
    proc.kill()
    proc.wait()
    assert tree.left() == []


def test_a_setsid_grandchild_goes_when_the_run_ends(tmp_path: Path, tree: Tree) -> None:
    """The script's own process group is ended after its window; a process it started in a
    session of its own goes too."""
    pid_file = tmp_path / "escapee.pid"
    window = ("--warmup", "2", "--max-warmup", "0", "--steps", "3", "--min-time", "0")
    proc = _start(
        tree, tmp_path, "profile", "--no-fix", *window, "--out", tmp_path / "r",
        SCRIPTS / "escapes_session.py", pid_file, "--steps", "100000",
    )  # fmt: skip
    _await_file(pid_file, proc)
    escapee = _escapee(pid_file, tree)
    assert proc.wait(timeout=120) == 0, (tmp_path / "stderr.txt").read_text()
    assert escapee is not None
    assert tree.left() == []


def test_a_setsid_grandchild_goes_when_trainadvisor_is_killed(tmp_path: Path, tree: Tree) -> None:
    pid_file = tmp_path / "escapee.pid"
    proc = _start(
        tree, tmp_path, "profile", "--out", tmp_path / "r", SCRIPTS / "escapes_session.py", pid_file
    )
    _await_file(pid_file, proc)
    assert _escapee(pid_file, tree) is not None
    tree.snapshot(psutil.Process(proc.pid))
    proc.kill()
    proc.wait()
    assert tree.left() == []


# ---- a script that dies without a word keeps what it measured ----


def _dies(tmp_path: Path, *args: str, stop_after_window: bool = True) -> RunSpec:
    """2 warm-up steps then 6 timed, of 0.3 s each: long enough for each save (`progress`)."""
    return RunSpec(
        "baseline", SCRIPTS / "dies.py", list(args), tmp_path, warmup=2, steps=6, profile=False,
        show_output=False, stop_after_window=stop_after_window,
    )  # fmt: skip


def test_sigkill_inside_the_window_keeps_its_steps_and_says_so(tmp_path: Path) -> None:
    """As the out-of-memory killer would, inside step 6 of 0-7: steps 2-4 were timed and saved
    (step 5's record is made just after the save at its end, and went with the process)."""
    raw = measure(_dies(tmp_path, "--after", "6", "--kill"))
    assert (raw.status, raw.exit_code, raw.steps_seen) == ("script_failed", -9, 6)
    assert raw.error == (
        "the script was killed by signal SIGKILL after 6 steps, inside the measuring window (the "
        "kernel's out-of-memory killer sends SIGKILL: check the machine's memory)"
    )
    assert [s.index for s in raw.steps] == [2, 3, 4]
    assert raw.shape is not None and raw.shape.timed_end == "script ended"


def test_os_exit_inside_the_window_is_an_exit_code_with_its_steps(tmp_path: Path) -> None:
    raw = measure(_dies(tmp_path, "--after", "6", "--code", "3"))
    assert (raw.status, raw.exit_code, raw.steps_seen) == ("script_failed", 3, 6)
    assert raw.error == (
        "the script's process exited with code 3 after 6 steps, inside the measuring window, without "
        "Python's own exit (os._exit(), or a library's exit())"
    )
    assert [s.index for s in raw.steps] == [2, 3, 4]


def test_os_exit_0_inside_the_window_is_the_script_ending(tmp_path: Path) -> None:
    """As `sys.exit(0)` there would be: the script ended, its window cut short."""
    raw = measure(_dies(tmp_path, "--after", "6"))
    assert (raw.status, raw.exit_code, raw.error, raw.steps_seen) == ("script_ended", 0, None, 6)
    assert [s.index for s in raw.steps] == [2, 3, 4]


def test_sigkill_after_the_window_keeps_the_window_and_says_so(tmp_path: Path) -> None:
    """--run-to-end: the window (steps 2-7, then step 8 whose memory was measured, untimed) was
    written whole; the script died in step 12."""
    raw = measure(_dies(tmp_path, "--after", "12", "--kill", stop_after_window=False))
    assert (raw.status, raw.exit_code, raw.steps_seen) == ("window_complete", -9, 12)
    assert raw.error == (
        "the script was killed by signal SIGKILL after 12 steps, after its window was measured (the "
        "kernel's out-of-memory killer sends SIGKILL: check the machine's memory)"
    )
    assert [s.index for s in raw.steps] == [2, 3, 4, 5, 6, 7, 8]
    assert [s.index for s in raw.steps if not s.profiled] == [2, 3, 4, 5, 6, 7]


def test_the_report_of_a_script_killed_in_its_window_shows_its_steps(tmp_path: Path, tree: Tree) -> None:
    out, script = tmp_path / "r", SCRIPTS / "dies.py"
    window = ("--warmup", "2", "--max-warmup", "0", "--steps", "20", "--min-time", "0")  # steps 2-21
    proc = _start(tree, tmp_path, "profile", *window, "--out", out, script, "--after", "12", "--kill")
    assert proc.wait(timeout=120) == 3
    raw = load_report(out)["baseline"]["raw"]
    assert (raw["status"], raw["exit_code"], raw["steps_seen"]) == ("script_failed", -9, 12)
    assert [step["index"] for step in raw["steps"]] == list(range(2, 11))
    error = raw["error"]
    assert error == (
        "the script was killed by signal SIGKILL after 12 steps, inside the measuring window (the kernel's "
        "out-of-memory killer sends SIGKILL: check the machine's memory)"
    )
    assert (tmp_path / "stderr.txt").read_text().splitlines()[-1] == (
        f"trainadvisor: error: {script} failed: {error}. What was measured before it failed is in "
        f"{out / 'report.html'}"
    )
    assert f"**The script failed:** {error}" in (out / "report.md").read_text().replace("\\", "")
    assert tree.left() == []


# ---- a signal is acted on where the run checks for it ----

# trainadvisor's own command line, with a stand-in for coverage's collector: a lock held while
# it records a line, which the clean-up needs again (the run's clean-up code is traced too). The
# first trial window raises SIGTERM inside that lock (os.kill delivers it before it returns).
HARNESS = """
import os, signal, sys, threading
from trainadvisor import cli
from trainadvisor.measure import kept_alive as live

collector = threading.Lock()
window, cancel = live.LiveRun.window, live.Prestarted.cancel

def interrupted_window(self, *args, **kwargs):
    collector.acquire()  # held as C code holds it: no exception releases it
    os.kill(os.getpid(), signal.SIGTERM)
    print("signalled", file=sys.stderr, flush=True)
    while SPIN:
        pass  # code without a safe point, for as long as it takes
    collector.release()
    return window(self, *args, **kwargs)

def traced_cancel(self):
    with collector:
        return cancel(self)

live.LiveRun.window, live.Prestarted.cancel = interrupted_window, traced_cancel
SPIN = sys.argv.pop(1) == "spin"
sys.argv[0] = "trainadvisor"
cli.main()
"""


def _harness(tree: Tree, tmp_path: Path, spin: bool) -> subprocess.Popen[str]:
    return _start(
        tree, tmp_path, "spin" if spin else "once", "profile", "--warmup", "2", "--max-warmup", "0",
        "--steps", "5", "--min-time", "0", "--out", tmp_path / "r", SCRIPTS / "short_run.py",
        "--max-steps", "100000",
        python=[sys.executable, "-c", HARNESS],
    )  # fmt: skip


@pytest.mark.skipif(
    not priority.restorable(),
    reason="no confirmation run is started ahead where a lowered priority cannot be raised back: no "
    "Prestarted.cancel to wait for the lock",
)
def test_sigterm_inside_code_that_holds_a_lock_is_acted_on_after_it(tmp_path: Path, tree: Tree) -> None:
    """The signal's exception was raised inside the collector's lock, and the clean-up
    (Prestarted.cancel) then waited for that lock forever: now the signal is noted there and
    acted on at the run's next check, the lock long released."""
    proc = _harness(tree, tmp_path, spin=False)
    try:
        code = proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        pytest.fail("trainadvisor did not stop: its clean-up waits for the lock the signal left held")
    stderr = (tmp_path / "stderr.txt").read_text()
    assert code == 143, stderr
    assert stderr.splitlines()[-1] == "trainadvisor: interrupted; the script and its workers were stopped"
    assert load_report(tmp_path / "r")["notes"][-1].startswith("The run was interrupted")
    assert tree.left() == []


def test_a_second_signal_stops_at_once(tmp_path: Path, tree: Tree) -> None:
    """The first signal waits for the run's next check, which code without one never reaches;
    a second ends every process of the run at once."""
    proc = _harness(tree, tmp_path, spin=True)
    _await_line("signalled", proc, tmp_path / "stderr.txt")
    time.sleep(0.5)  # still spinning: the first signal is only noted
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=10)
    stderr = (tmp_path / "stderr.txt").read_text()
    assert code == 143, stderr
    assert stderr.splitlines()[-1] == (
        "trainadvisor: signalled again: the script and its workers were killed without waiting"
    )
    assert tree.left() == []


def test_a_dataloader_workers_death_is_reported_with_how_it_died(tmp_path: Path) -> None:
    """torch says only "DataLoader worker (pid(s) N) exited unexpectedly"; the error, in the
    console and the report, says how it died, by its exit status: here SIGBUS, which most often
    means a /dev/shm too small."""
    out = tmp_path / "r"
    done = subprocess.run(
        [sys.executable, "-m", "trainadvisor", "profile", "--out", str(out), str(SCRIPTS / "worker_dies.py")],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    said = done.stderr.strip().splitlines()[-1]
    assert "exited unexpectedly; trainadvisor: the DataLoader's worker pid " in said
    died = "was killed by signal SIGBUS (most often shared memory (/dev/shm) too small for the batches"
    assert died in said
    assert died in load_report(out)["baseline"]["raw"]["error"]


# ---- the script is scheduled as it would be without trainadvisor ----

IDS = """\
import json, os, sys
ids = {"pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0)}
open(sys.argv[1], "w").write(json.dumps(ids))
"""


@pytest.mark.skipif(sys.version_info < (3, 11), reason="Python 3.10's subprocess has no process_group")
def test_the_script_runs_in_trainadvisors_session_in_a_process_group_of_its_own(tmp_path: Path) -> None:
    """In trainadvisor's session, as `python SCRIPT` in its place would be (Linux schedules a
    session's threads as a group: in a session of its own, beside a busy core, the example's loop
    ran 7 steps/s against 45 by itself); in a process group of its own, which `stop` and the
    guard end, and which a Ctrl-C to trainadvisor's group spares."""
    script, written = tmp_path / "ids.py", tmp_path / "ids.json"
    script.write_text(IDS)
    spec = RunSpec("baseline", script, [str(written)], tmp_path, 1, 2, profile=False, show_output=False)
    raw = measure(spec)
    ids = json.loads(written.read_text())
    assert raw.exit_code == 0
    assert ids["sid"] == os.getsid(0) and ids["pgid"] == ids["pid"] != os.getpgid(0)


MEASURE_PRINTS = """\
import sys
from pathlib import Path
from trainadvisor.measure.runner import RunSpec, measure
spec = RunSpec("baseline", Path(sys.argv[1]), [], Path(sys.argv[2]), 1, 2, profile=False, show_output=True)
raw = measure(spec)
print("exit code", raw.exit_code, flush=True)
"""


PRINTS_AND_PROMPTS = """\
print("printed by the script", flush=True)
try:
    open("/dev/tty", "r+")
except OSError:
    print("no terminal to prompt on", flush=True)
"""


@pytest.mark.skipif(sys.version_info < (3, 11), reason="Python 3.10's script has a session of its own")
def test_a_script_on_a_terminal_that_stops_background_groups_prints_and_cannot_prompt(
    tmp_path: Path, tree: Tree
) -> None:
    """trainadvisor on a terminal set to stop background writers (`stty tostop`), the script's
    output shown there. The script, in a process group that is not the terminal's foreground one,
    prints and ends as it would in the foreground (the kernel's SIGTTOU would stop it), and it
    has no terminal to prompt on (a read there would stop it: SIGTTIN), as in a session of its
    own: a prompt fails at once."""
    script = tmp_path / "prints.py"
    script.write_text(PRINTS_AND_PROMPTS)
    pid, terminal = pty.fork()
    if pid == 0:  # a session of its own, the terminal its controlling one, trainadvisor in front
        try:
            attrs = termios.tcgetattr(0)
            attrs[3] |= termios.TOSTOP
            termios.tcsetattr(0, termios.TCSANOW, attrs)
            os.execv(sys.executable, [sys.executable, "-c", MEASURE_PRINTS, str(script), str(tmp_path)])
        finally:
            os._exit(127)
    tree.watch(pid)
    shown, deadline = b"", time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            if not select.select([terminal], [], [], 1.0)[0]:
                continue
            try:
                chunk = os.read(terminal, 4096)
            except OSError:  # the terminal's other end closed: everything was read
                break
            if not chunk:
                break
            shown += chunk
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)  # a stopped script is ended by trainadvisor's guard
        os.waitpid(pid, 0)
        os.close(terminal)
    assert b"printed by the script" in shown and b"no terminal to prompt on" in shown
    assert b"exit code 0" in shown and tree.left() == []
