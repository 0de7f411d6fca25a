"""The fault suite (issue 16): hostile traces, a full disk, signals to the parent or its group,
console noise, Markdown from user text. Each case asserts the exit code, the one-line message,
the memory bound where there is one, that the report is kept, and that no process is left."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from trainadvisor.measure.console import NoiseFilter
from trainadvisor.measure.watchdog import Watchdog, innermost_script_frame
from trainadvisor.report import mdtext


def test_kinetos_chatter_is_dropped_however_the_stream_is_cut() -> None:
    stream = (
        b"epoch 0\nUSDT:2026-11-24 07:04:22 3053:3053 SyncActivityProfilerHandler.cpp:52] profiler_start\n"
        b"STAGE:2026-11-24 07:04:22 3053:3053 ActivityProfilerController.cpp:312] Completed Stage: Warm Up\n"
        b"ERROR:2026-11-24 07:04:23 3053:3053 output_json.cpp:977] Failed to write to log file!\n"
        b"USDT: not kineto's\n 50%|#####     |\r100%|##########|\nUSDT"
    )
    kept = (
        b"epoch 0\nERROR:2026-11-24 07:04:23 3053:3053 output_json.cpp:977] Failed to write to log file!\n"
        b"USDT: not kineto's\n 50%|#####     |\r100%|##########|\nUSDT"
    )
    for size in (1, 3, 7, 64, len(stream)):
        noise = NoiseFilter()
        out = b"".join(noise.feed(stream[i : i + size]) for i in range(0, len(stream), size))
        assert out + noise.flush() == kept, size
    noise = NoiseFilter()  # a progress bar's update is passed on before its line ends
    assert noise.feed(b" 50%|#####") == b" 50%|#####"


def test_user_text_in_report_md_is_shown_as_text() -> None:
    assert mdtext.inline("see <img src=x onerror=alert(1)> and [a](http://x) *b* | c\nd") == (
        r"see \<img src=x onerror=alert(1)\> and \[a\](http://x) \*b\* \| c d"
    )
    assert mdtext.inline("set `num_workers=4` <b>") == r"set `num_workers=4` \<b\>"
    assert mdtext.inline("one ` tick") == r"one \` tick"
    assert mdtext.cell("`a|b` c|d") == r"`a\|b` c\|d"
    assert mdtext.code("train.py --name `x`") == "`` train.py --name `x` ``"
    assert mdtext.fence("x = '''```'''") == "````"


NO_SUCH_PID = 2**31 - 1  # past any pid_max: the stalled run's stacks are asked of no process


def _beat(path: Path, progress: int, pid: int = NO_SUCH_PID, busy: bool = False) -> None:
    path.write_bytes(struct.pack("<qqq", progress, pid, busy))


def test_the_watchdog_waits_twenty_longest_gaps_and_at_least_ten_minutes(tmp_path: Path) -> None:
    beat = tmp_path / "run.heartbeat"
    dog = Watchdog([beat], [tmp_path / "run.stacks.txt"], tmp_path / "logs")
    assert dog.stalled(0.0) is None  # no heartbeat yet: start-up is not a stall
    _beat(beat, 0)
    assert dog.stalled(5000.0) is None  # no step or batch yet
    for progress, now in ((1, 1000.0), (2, 1040.0), (3, 1041.0)):  # the longest gap: 40 s
        _beat(beat, progress)
        assert dog.stalled(now) is None
    assert dog.slowest_s == 40.0
    assert dog.stalled(1041.0 + 800.0) is None  # 20 x 40 s
    dog.limit_s = 5.0
    assert dog.stalled(1041.0 + 800.5) == (
        "no training step or batch for 800 s (the longest gap before was 40.0 s): the script looks stuck "
        "and was stopped; no Python stacks could be taken"
    )
    fast = Watchdog([beat], [], tmp_path)
    for progress, now in ((4, 0.0), (5, 0.1)):
        _beat(beat, progress)
        fast.stalled(now)
    assert fast.stalled(600.0) is None and fast.stalled(600.2) is not None  # at least 10 minutes
    waited = Watchdog([beat], [], tmp_path)  # a run waiting for the parent's next command
    _beat(beat, 10)
    waited.stalled(0.0)
    _beat(beat, 11)
    waited.stalled(0.1)
    waited.restart(5000.0)  # the command is sent 5000 s later: no stall counted before it
    assert waited.stalled(5599.0) is None and waited.stalled(5600.5) is not None
    exporting = Watchdog([beat], [], tmp_path)  # trainadvisor's own work in the process
    _beat(beat, 12)
    exporting.stalled(0.0)
    _beat(beat, 12, busy=True)
    assert exporting.stalled(900.0) is None and exporting.stalled(1400.0) is None
    _beat(beat, 13)
    assert exporting.stalled(1400.5) is None
    assert exporting.stalled(2000.0) is None and exporting.stalled(2001.0) is not None


def test_each_ranks_innermost_frame_of_the_script_is_named() -> None:
    dump = (
        "Thread 0x00007f0000000001 (most recent call first):\n"
        '  File "/usr/lib/python3.12/threading.py", line 359 in wait\n'
        '  File "/home/u/site-packages/torch/utils/data/_utils/pin_memory.py", line 52 in do_one_step\n\n'
        "Current thread 0x00007f0000000002 (most recent call first):\n"
        '  File "/usr/lib/python3.12/site-packages/torch/distributed/c10d.py", line 2806 in all_reduce\n'
        '  File "/home/u/train.py", line 88 in sync_grads\n'
        '  File "/home/u/train.py", line 120 in <module>\n'
    )
    assert innermost_script_frame(dump) == "train.py:88 in sync_grads"
    assert innermost_script_frame('  File "/usr/lib/python3.12/threading.py", line 1 in run\n') == ""


def test_a_log_keeps_its_first_and_last_bytes_and_says_how_much_was_cut(tmp_path: Path) -> None:
    from trainadvisor.measure.console import CappedLog

    log = CappedLog(tmp_path / "x.log", head_bytes=10, tail_bytes=8)
    for chunk in (b"0123456", b"789abcdef", b"ghijklmnop", b"qrstuv"):
        log.write(chunk)
    log.close()
    log.close()  # once is enough
    assert (tmp_path / "x.log").read_bytes() == (
        b"0123456789"
        + b"\n[trainadvisor: 14 bytes of the script's output cut here; the log keeps its first and last "
        + b"16 MiB]\n"
        + b"opqrstuv"
    )


def test_a_stalled_process_is_given_time_to_write_its_stacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the stalled run's process took the signal, the watchdog waits for its stacks
    before it reads them (where none did, `test_the_watchdog_waits_...` reports at once)."""
    from trainadvisor.measure import watchdog

    signalled: list[int] = []
    waited: list[float] = []
    monkeypatch.setattr(watchdog.os, "kill", lambda pid, sig: signalled.append(pid))
    monkeypatch.setattr(watchdog.time, "sleep", waited.append)
    beat = tmp_path / "run.heartbeat"
    dog = Watchdog([beat], [tmp_path / "run.stacks.txt"], tmp_path / "logs")
    dog.limit_s = 5.0
    for progress, now in ((1, 0.0), (2, 1.0)):
        _beat(beat, progress, pid=4242)
        dog.stalled(now)
    assert dog.stalled(7.0) is not None
    assert signalled == ([4242] if watchdog.DUMP_SIGNAL is not None else []) and waited == (
        [watchdog.DUMP_WAIT_S] if signalled else []
    )
