"""How a run's processes are found and ended (`measure.reaper`), psutil's process table and the
calls that reach the kernel (getpgid, killpg, prctl) replaced by stand-ins: which processes carry
the run's token, which lie outside the leader's group, which are signalled pass after pass and
which of psutil's errors (a process gone, a zombie, another user's) are passed over. The guard
process itself (`Guard()`) is never started: only its side of the pipe is checked, on a fake."""

from __future__ import annotations

import io
import signal
import sys
import types
from subprocess import TimeoutExpired
from typing import Any

import psutil
import pytest

from trainadvisor.measure import reaper

TOKEN = "a" * 32
OURS = 4242  # this process's pid, as the fake `os` says


class FakeProcess:
    """What the reaper asks of a psutil.Process; each method raises the error set for it, as a
    real process that ended, turned zombie or belongs to another user would."""

    def __init__(
        self,
        pid: int,
        env: dict[str, str] | None = None,
        fails: dict[str, Exception] | None = None,
        alive: list[bool] | None = None,
        status: str = psutil.STATUS_SLEEPING,
        children: list[FakeProcess] | None = None,
    ) -> None:
        self.pid = pid
        self.env = env or {}
        self.fails = fails or {}
        self.alive = alive if alive is not None else [True]  # is_running's answers, the last repeated
        self.state = status
        self.kids = children or []
        self.signals: list[int] = []

    def _raise(self, method: str) -> None:
        if method in self.fails:
            raise self.fails[method]

    def environ(self) -> dict[str, str]:
        self._raise("environ")
        return self.env

    def send_signal(self, sig: int) -> None:
        self._raise("send_signal")
        self.signals.append(sig)

    def is_running(self) -> bool:
        self._raise("is_running")
        return self.alive.pop(0) if len(self.alive) > 1 else self.alive[0]

    def status(self) -> str:
        self._raise("status")
        return self.state

    def children(self, recursive: bool = False) -> list[FakeProcess]:
        assert recursive
        self._raise("children")
        return self.kids


def _marked(pid: int, token: str = TOKEN, **kwargs: Any) -> FakeProcess:
    return FakeProcess(pid, {reaper.RUN_ENV: token, "HOME": "/root"}, **kwargs)


def _fake_os(monkeypatch: pytest.MonkeyPatch, **calls: Any) -> types.SimpleNamespace:
    """The reaper's `os`: our pid is OURS; the rest as given."""
    fake = types.SimpleNamespace(getpid=lambda: OURS, **calls)
    monkeypatch.setattr(reaper, "os", fake)
    return fake


def _table(monkeypatch: pytest.MonkeyPatch, *passes: list[FakeProcess]) -> None:
    """psutil's process table: each call of process_iter lists the next pass (the last repeated)."""
    left = list(passes)

    def process_iter() -> list[FakeProcess]:
        return left.pop(0) if len(left) > 1 else left[0]

    monkeypatch.setattr(psutil, "process_iter", process_iter)


def test_a_run_token_is_32_hex_digits_and_new_each_time() -> None:
    tokens = {reaper.new_token() for _ in range(3)}
    assert len(tokens) == 3
    assert all(len(t) == 32 and int(t, 16) >= 0 and t == t.lower() for t in tokens)


def test_the_marked_processes_carry_this_runs_token_and_are_not_our_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fake_os(monkeypatch)
    table = [
        _marked(OURS),  # trainadvisor itself, had it the token
        _marked(101),
        _marked(102, token="b" * 32),  # another run's
        FakeProcess(103, {"HOME": "/root"}),  # no token
        _marked(104, fails={"environ": psutil.AccessDenied(104)}),  # another user's
        _marked(105, fails={"environ": psutil.ZombieProcess(105)}),
        _marked(106, fails={"environ": psutil.NoSuchProcess(106)}),  # ended since it was listed
        _marked(107),
    ]
    _table(monkeypatch, table)
    assert [p.pid for p in reaper.marked(TOKEN)] == [101, 107]


def test_an_error_that_is_not_psutils_is_not_passed_over_when_marking(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fake_os(monkeypatch)
    _table(monkeypatch, [_marked(101, fails={"environ": ValueError("boom")})])
    with pytest.raises(ValueError, match="boom"):
        reaper.marked(TOKEN)


def test_strays_are_the_marked_and_the_leaders_descendants_outside_its_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    leader = 500
    groups = {101: leader, 102: 102, 104: leader, 105: 777}  # 102 and 105 left the group (setsid)

    def getpgid(pid: int) -> int:
        if pid not in groups:
            raise ProcessLookupError(pid)  # 103: gone before its group was read
        return groups[pid]

    _fake_os(monkeypatch, getpgid=getpgid)
    marked_102 = _marked(102)
    _table(monkeypatch, [_marked(101), marked_102, _marked(103)])
    # the leader's descendants: 104 in its group, 105 outside with its environment cleared, and
    # 102 again (found through both: counted once)
    tree = FakeProcess(leader, children=[FakeProcess(104), FakeProcess(105), FakeProcess(102)])
    asked: list[int] = []

    def process(pid: int) -> FakeProcess:
        asked.append(pid)
        return tree

    monkeypatch.setattr(psutil, "Process", process)
    found = reaper.strays(TOKEN, leader)
    assert asked == [leader]
    assert [p.pid for p in found] == [102, 105]
    assert found[0] is not marked_102  # the descendant's object replaced the marked one for pid 102


def test_strays_of_a_leader_that_is_gone_are_the_marked_outside_its_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fake_os(monkeypatch, getpgid=lambda pid: {101: 500, 102: 102}[pid])
    _table(monkeypatch, [_marked(101), _marked(102)])

    def process(pid: int) -> FakeProcess:
        raise psutil.NoSuchProcess(pid)

    monkeypatch.setattr(psutil, "Process", process)
    assert [p.pid for p in reaper.strays(TOKEN, 500)] == [102]


def test_signal_all_signals_each_process_once_past_those_gone_zombie_or_not_ours() -> None:
    procs = [
        FakeProcess(1),
        FakeProcess(2, fails={"send_signal": psutil.NoSuchProcess(2)}),
        FakeProcess(3, fails={"send_signal": psutil.ZombieProcess(3)}),
        FakeProcess(4, fails={"send_signal": psutil.AccessDenied(4)}),
        FakeProcess(5),
    ]
    reaper.signal_all(procs, signal.SIGTERM)
    assert [(p.pid, p.signals) for p in procs] == [
        (1, [signal.SIGTERM]), (2, []), (3, []), (4, []), (5, [signal.SIGTERM]),
    ]  # fmt: skip


def test_a_signal_error_that_is_not_psutils_is_raised() -> None:
    procs = [FakeProcess(1, fails={"send_signal": OSError("bad")}), FakeProcess(2)]
    with pytest.raises(OSError, match="bad"):
        reaper.signal_all(procs, signal.SIGKILL)
    assert procs[1].signals == []


def test_only_a_process_that_runs_and_is_no_zombie_keeps_the_run_running() -> None:
    gone = FakeProcess(1, alive=[False])
    zombie = FakeProcess(2, status=psutil.STATUS_ZOMBIE)
    vanished = FakeProcess(3, fails={"is_running": psutil.NoSuchProcess(3)})
    unreadable = FakeProcess(4, fails={"status": psutil.AccessDenied(4)})
    assert not reaper.running([])
    assert not reaper.running([gone, zombie, vanished, unreadable])
    assert reaper.running([gone, zombie, vanished, FakeProcess(5, status=psutil.STATUS_DISK_SLEEP)])


def test_a_sweep_kills_the_leaders_group_and_the_marked_until_a_pass_finds_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    killed_groups: list[tuple[int, int]] = []
    _fake_os(monkeypatch, killpg=lambda pid, sig: killed_groups.append((pid, sig)))
    sleeps: list[float] = []
    monkeypatch.setattr(reaper, "time", types.SimpleNamespace(sleep=sleeps.append))
    first, late = _marked(101), _marked(103)
    _table(monkeypatch, [first, FakeProcess(150)], [late], [FakeProcess(151)])
    leader = FakeProcess(300, alive=[True, False])  # running at the first pass, killed by it
    gone_leader = FakeProcess(301, fails={"is_running": psutil.NoSuchProcess(301)})
    unlowered: list[list[int]] = []
    monkeypatch.setattr(reaper, "unlower", lambda procs: unlowered.append([p.pid for p in procs]))
    reaper.sweep(TOKEN, [leader, gone_leader])
    assert killed_groups == [(300, signal.SIGKILL)]
    assert unlowered == [[101, 300], [103]]  # each pass's killed, raised to end at once
    assert (first.signals, late.signals, leader.signals) == (
        [signal.SIGKILL],
        [signal.SIGKILL],
        [signal.SIGKILL],
    )
    assert sleeps == [0.05, 0.05]  # after each pass that found something; none after the empty third


def test_a_leader_whose_group_is_already_gone_is_not_signalled(monkeypatch: pytest.MonkeyPatch) -> None:
    def killpg(pid: int, sig: int) -> None:
        raise ProcessLookupError(pid)

    _fake_os(monkeypatch, killpg=killpg)
    monkeypatch.setattr(reaper, "time", types.SimpleNamespace(sleep=lambda s: None))
    _table(monkeypatch, [])
    leader = FakeProcess(300)
    reaper.sweep(TOKEN, [leader])
    assert leader.signals == []


def test_a_sweep_gives_up_after_its_passes_when_a_process_keeps_coming_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fake_os(monkeypatch)
    sleeps: list[float] = []
    monkeypatch.setattr(reaper, "time", types.SimpleNamespace(sleep=sleeps.append))
    undying = _marked(101)
    _table(monkeypatch, [undying])
    monkeypatch.setattr(reaper, "unlower", lambda procs: None)
    reaper.sweep(TOKEN, [])
    assert reaper.SWEEPS == 20
    assert undying.signals == [signal.SIGKILL] * 20 and len(sleeps) == 20


def _guard_input(monkeypatch: pytest.MonkeyPatch, chunks: list[bytes], parents: list[int]) -> list[int]:
    """The guard's stdin as `chunks` (b"" at its end), select ready for each but once at first,
    and getppid's answers (the last repeated); returns the pids psutil.Process was asked for."""
    ready = [False, *[True] * len(chunks)]
    monkeypatch.setattr(
        reaper, "select", types.SimpleNamespace(select=lambda r, w, x, t: (r if ready.pop(0) else [], w, x))
    )
    answers = list(parents)
    _fake_os(
        monkeypatch,
        read=lambda fd, n: chunks.pop(0),
        getppid=lambda: answers.pop(0) if len(answers) > 1 else answers[0],
    )
    asked: list[int] = []

    def process(pid: int) -> FakeProcess:
        asked.append(pid)
        if pid == 99:
            raise psutil.NoSuchProcess(pid)  # ended before the guard looked
        return FakeProcess(pid)

    monkeypatch.setattr(psutil, "Process", process)
    monkeypatch.setattr(reaper, "_asked_to_end", [])
    return asked


def test_the_guard_collects_the_pids_sent_across_reads_until_its_pipe_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked = _guard_input(monkeypatch, [b"12\n3", b"4\nnot a pid\n99\n", b""], [7])
    leaders: list[Any] = []
    reaper._guard(leaders)
    assert asked == [12, 34, 99]  # "3" and "4" are one pid, split between reads
    assert [p.pid for p in leaders] == [12, 34]


def test_the_guard_stops_waiting_when_its_parent_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    # trainadvisor ended while a process forked from it holds the pipe: the guard is reparented
    asked = _guard_input(monkeypatch, [b"12\n", b""], [7, 7, 1])
    leaders: list[Any] = []
    reaper._guard(leaders)
    assert asked == [] and leaders == []  # the first select was not ready; then the parent changed


def test_the_guard_stops_waiting_when_it_is_signalled(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _guard_input(monkeypatch, [b"12\n", b""], [7])
    reaper._asked_to_end.append(signal.SIGTERM)
    leaders: list[Any] = []
    reaper._guard(leaders)
    assert asked == [] and leaders == []


def test_the_guards_program_ignores_ctrl_c_notes_term_and_hup_and_sweeps_its_leaders(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handlers: dict[int, Any] = {}
    fake_signal = types.SimpleNamespace(
        SIGINT=signal.SIGINT,
        SIGTERM=signal.SIGTERM,
        SIGHUP=signal.SIGHUP,
        SIG_IGN=signal.SIG_IGN,
        signal=lambda sig, handler: handlers.__setitem__(sig, handler),
    )  # this process's own handlers stay as they are
    monkeypatch.setattr(reaper, "signal", fake_signal)
    monkeypatch.setattr(reaper, "_asked_to_end", [])
    calls: list[tuple[str, Any]] = []
    monkeypatch.setattr(reaper, "_guard", lambda leaders: leaders.append(FakeProcess(12)))
    monkeypatch.setattr(
        reaper, "sweep", lambda token, leaders: calls.append((token, [p.pid for p in leaders]))
    )
    assert reaper.main([TOKEN]) == 0
    assert calls == [(TOKEN, [12])]
    assert handlers[signal.SIGINT] is signal.SIG_IGN
    handlers[signal.SIGHUP](signal.SIGHUP, None)
    handlers[signal.SIGTERM](signal.SIGTERM, None)
    assert reaper._asked_to_end == [signal.SIGHUP, signal.SIGTERM]


class FakePipe(io.BytesIO):
    def __init__(self, broken: bool = False) -> None:
        super().__init__()
        self.broken = broken
        self.flushes = 0

    def write(self, data: Any) -> int:
        if self.broken:
            raise BrokenPipeError("the guard is gone")
        return super().write(data)

    def flush(self) -> None:
        self.flushes += 1

    def close(self) -> None:
        self.written = self.getvalue()
        super().close()


class FakeGuardProcess:
    """The guard process as Guard sees it: its stdin, and waits that time out as told."""

    def __init__(self, stdin: FakePipe, timeouts: int = 0) -> None:
        self.stdin = stdin
        self.timeouts = timeouts
        self.calls: list[str] = []

    def wait(self, timeout: float | None = None) -> int:
        self.calls.append(f"wait({timeout})")
        if self.timeouts:
            self.timeouts -= 1
            raise TimeoutExpired("guard", timeout or 0.0)
        return 0

    def kill(self) -> None:
        self.calls.append("kill")


def _guard(stdin: FakePipe, timeouts: int = 0) -> reaper.Guard:
    guard = reaper.Guard.__new__(reaper.Guard)  # its constructor would start the guard's process
    guard.proc = FakeGuardProcess(stdin, timeouts)  # type: ignore[assignment]
    return guard


def test_the_guard_is_told_each_pid_on_a_line_of_its_own() -> None:
    pipe = FakePipe()
    guard = _guard(pipe)
    guard.watch(123)
    guard.watch(45)
    assert (pipe.getvalue(), pipe.flushes) == (b"123\n45\n", 2)


def test_a_guard_that_is_gone_is_not_an_error_to_tell() -> None:
    _guard(FakePipe(broken=True)).watch(123)


def test_closing_the_guard_closes_its_pipe_and_waits_for_its_last_sweep() -> None:
    pipe = FakePipe()
    guard = _guard(pipe)
    guard.watch(7)
    guard.close()
    assert pipe.closed and pipe.written == b"7\n"
    assert guard.proc.calls == ["wait(10.0)"]  # type: ignore[attr-defined]


def test_a_guard_that_does_not_end_in_time_is_killed() -> None:
    guard = _guard(FakePipe(), timeouts=1)
    guard.close()
    assert guard.proc.calls == ["wait(10.0)", "kill", "wait(None)"]  # type: ignore[attr-defined]


def test_a_child_without_a_parent_to_die_with_asks_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    exits: list[int] = []
    fake = _fake_os(monkeypatch, environ={"PATH": "/bin"}, getppid=lambda: 7, _exit=exits.append)
    reaper.die_with_parent()
    assert fake.environ == {"PATH": "/bin"} and exits == []


def _child_of(monkeypatch: pytest.MonkeyPatch, expected: str, parent: int, platform: str) -> tuple[Any, ...]:
    """die_with_parent in a child told to die with `expected`, whose parent is `parent`: (the
    environment after, the os._exit codes, the prctl calls)."""
    exits: list[int] = []
    environ = {reaper.PARENT_ENV: expected, "PATH": "/bin"}
    _fake_os(monkeypatch, environ=environ, getppid=lambda: parent, _exit=exits.append)
    monkeypatch.setattr(reaper, "sys", types.SimpleNamespace(platform=platform))
    prctl: list[tuple[int, ...]] = []

    class Libc:
        def prctl(self, *args: int) -> int:
            prctl.append(args)
            return 0

    fake_ctypes = types.SimpleNamespace(CDLL=lambda name, use_errno: Libc())
    monkeypatch.setitem(sys.modules, "ctypes", fake_ctypes)  # never this process's own prctl
    reaper.die_with_parent()
    return environ, exits, prctl


def test_a_child_on_linux_asks_the_kernel_for_sigkill_at_its_parents_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    environ, exits, prctl = _child_of(monkeypatch, "7", 7, "linux")
    assert environ == {"PATH": "/bin"}  # not passed on to what the script starts
    assert prctl == [(1, signal.SIGKILL, 0, 0, 0)] and exits == []


def test_a_child_whose_parent_already_ended_exits_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    environ, exits, prctl = _child_of(monkeypatch, "7", 1, "linux")  # reparented to init
    assert exits == [1] and len(prctl) == 1


def test_a_child_elsewhere_than_linux_only_checks_its_parent(monkeypatch: pytest.MonkeyPatch) -> None:
    environ, exits, prctl = _child_of(monkeypatch, "7", 7, "darwin")
    assert (environ, exits, prctl) == ({"PATH": "/bin"}, [], [])
