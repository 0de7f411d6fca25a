"""The fault suite (issue 16): hostile traces, a full disk, signals to the parent or its group,
console noise, Markdown from user text. Each case asserts the exit code, the one-line message,
the memory bound where there is one, that the report is kept, and that no process is left."""

from __future__ import annotations

import gzip
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import DATA, EXAMPLES, SCRIPTS, load_report, processes_running


def _cli(*args: str | Path, cwd: Path, timeout_s: float = 120) -> tuple[int, str]:
    """Exit code and stderr of `python -m trainadvisor ARGS`."""
    done = subprocess.run(
        [sys.executable, "-m", "trainadvisor", *map(str, args)],
        cwd=cwd, capture_output=True, text=True, timeout=timeout_s,
    )  # fmt: skip
    return done.returncode, done.stderr


def _cli_peak_rss_bytes(*args: str | Path, cwd: Path) -> tuple[int, str, int]:
    """Exit code, stderr and peak resident memory of `python -m trainadvisor ARGS`, measured by
    a fresh process whose one child it is (this test process's other children do not count)."""
    measure = (
        "import resource, subprocess, sys; "
        "done = subprocess.run(sys.argv[1:], stderr=subprocess.PIPE, text=True); "
        "print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024); "
        "print(done.stderr, end='')"
    )
    command = [sys.executable, "-c", measure, sys.executable, "-m", "trainadvisor", *map(str, args)]
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=60)
    code, peak = done.stdout.splitlines()[0].split()
    return int(code), "".join(done.stdout.splitlines(keepends=True)[1:]), int(peak)


def _bomb(path: Path, name_bytes: int) -> None:
    """A gzip trace whose one event name is `name_bytes` long: ~1000x smaller on disk."""
    with gzip.open(path, "wb", compresslevel=9) as f:
        f.write(b'{"schemaVersion": 1, "traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "')
        block = b"a" * (1 << 24)
        for _ in range(name_bytes // len(block)):
            f.write(block)
        f.write(b'", "ts": 1, "dur": 2, "pid": 1, "tid": 1}]}')


def test_a_decompression_bomb_is_refused_at_once_in_bounded_memory(tmp_path: Path) -> None:
    """1.5 MB on disk, one 1.5 GB event name: refused at the 32 MB event limit."""
    trace = tmp_path / "bomb.json.gz"
    _bomb(trace, 1536 << 20)
    assert trace.stat().st_size < 2 << 20
    code, err, peak_bytes = _cli_peak_rss_bytes("analyze", "--out", tmp_path / "r", trace, cwd=tmp_path)
    assert code == 2
    assert err.splitlines() == [
        f"trainadvisor: error: {trace}: an event larger than 32 MB at byte 37; torch.profiler writes no such "
        "trace: the file is damaged or was not made by a profiler, and is not read further"
    ]
    assert peak_bytes < 400 << 20
    assert not (tmp_path / "r").exists()


def test_events_nested_past_any_limit_are_one_line(tmp_path: Path) -> None:
    """100,000 arrays in one another: past the nesting limit of every JSON decoder the reader
    uses, on every Python and library version (a few thousand is within some of them)."""
    depth = 100_000
    trace = tmp_path / "nested.json"
    nested = "[" * depth + "]" * depth
    trace.write_text(
        '{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "x", "ts": 1, "dur": 2, "pid": 1, '
        f'"tid": 1, "args": {{"a": {nested}}}}}]}}'
    )
    code, err = _cli("analyze", "--out", tmp_path / "r", trace, cwd=tmp_path)
    assert code == 2
    assert err.splitlines() == [
        f"trainadvisor: error: {trace}: an event nested deeper than any trace's (thousands of arrays or "
        "objects in one another); the file is damaged or was not made by a profiler, and is not read further"
    ]


def test_a_file_that_is_no_trace_is_not_read_to_its_end(tmp_path: Path) -> None:
    junk = tmp_path / "junk.json.gz"
    with gzip.open(junk, "wb") as f:
        for _ in range(40):
            f.write(b" " * (1 << 20))
    code, err = _cli("analyze", "--out", tmp_path / "r", junk, cwd=tmp_path)
    assert (code, err.splitlines()[0]) == (
        2,
        f'trainadvisor: error: {junk}: no "traceEvents" list in its first 16 MB; not a profiler trace '
        "(write traces with torch.profiler's export_chrome_trace or tensorboard_trace_handler)",
    )


def _in_small_filesystem(size: str, shell: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`shell` run with a fresh tmpfs of `size` mounted at /mnt (a user and mount namespace of its
    own: a real full disk, with no root needed)."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare (util-linux) to mount a small filesystem")
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"user namespaces are not allowed here: {probe.stderr.decode().strip()}")
    script = f"mount -t tmpfs -o size={size} tmpfs /mnt && {shell}"
    return subprocess.run(
        ["unshare", "-rm", "sh", "-c", script], cwd=cwd, capture_output=True, text=True, timeout=240
    )


def test_profile_onto_a_full_disk_stops_with_one_line_and_leaves_nothing_running(tmp_path: Path) -> None:
    python, script = sys.executable, EXAMPLES / "slow_input_mnist.py"
    out = f"/mnt/{tmp_path.name}"  # its own name on every command line: tests run side by side
    whole = f"{python} -c 'import json, sys; json.load(open(sys.argv[1])); print(\"whole\")'"
    done = _in_small_filesystem(
        "100k",
        f"{python} -m trainadvisor profile --out {out} {script} --samples 4000; echo rc=$?; "
        f"find {out} -name '*.tmp' 2>/dev/null; "  # the folder goes where the run left nothing in it
        f"for f in $(find {out} -name report.json 2>/dev/null); do {whole} $f; done",
        tmp_path,
    )
    lines, printed = done.stderr.splitlines(), done.stdout.splitlines()
    assert lines[-1].startswith(f"trainadvisor: error: no space left on device while writing {out}/")
    assert lines[-1].endswith("; free space or choose another --out")
    # no temporary left; a report.json, where an early stage's fitted before the disk filled, whole
    assert printed[printed.index("rc=2") :] in (["rc=2"], ["rc=2", "whole"])
    assert processes_running(script, out) == []


def test_a_full_disk_keeps_the_earlier_report_whole(tmp_path: Path) -> None:
    python = sys.executable
    done = _in_small_filesystem(
        "1m",
        f"cp -r {DATA / 'report'} /mnt/r && (cat /dev/zero > /mnt/filler 2>/dev/null; true) && "
        f"{python} -m trainadvisor report /mnt/r; echo rc=$?; "
        f"cmp /mnt/r/report.json {DATA / 'report/report.json'} && echo same; ls -a /mnt/r | LC_ALL=C sort",
        tmp_path,
    )
    [line] = done.stderr.splitlines()
    assert line == (
        # re-rendered in its own folder, report.json is left as saved: report.md is written first
        "trainadvisor: error: no space left on device while writing /mnt/r/report.md; free space or "
        "choose another --out"
    )
    assert done.stdout.split() == ["rc=2", "same", ".", "..", "SOURCE.md", "report.json"]


def _ignore_sigint() -> None:  # what a shell's background job or some schedulers start with
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize(
    ("signum", "to_group"), [(signal.SIGINT, False), (signal.SIGINT, True), (signal.SIGTERM, False)]
)
def test_a_signal_to_the_parent_or_its_group_stops_everything_and_keeps_the_report(
    tmp_path: Path, signum: int, to_group: bool
) -> None:
    out, script = tmp_path / "r", EXAMPLES / "slow_input_mnist.py"
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainadvisor", "profile", "--warmup", "3", "--steps", "10", "--out", str(out),
         str(script), "--samples", "20000"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, preexec_fn=_ignore_sigint,
    )  # fmt: skip
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if "measuring fix dataloader-workers" in line:
            break
    if to_group:
        os.killpg(proc.pid, signum)
    else:
        proc.send_signal(signum)
    stdout, rest = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum
    assert rest.splitlines()[-1] == "trainadvisor: interrupted; the script and its workers were stopped"
    report = load_report(out)
    assert [f["rule"] for f in report["findings"]] == ["data-stall"]
    assert report["notes"][-1].startswith("The run was interrupted")
    assert processes_running(script, tmp_path) == []
    console = "".join(seen) + rest + stdout
    assert "epoch 0 step 0 loss" in console  # the script's own output is shown...
    assert "USDT:" not in console and "STAGE:" not in console  # ...without Kineto's chatter


def test_a_hostile_script_name_and_error_cannot_break_report_md(tmp_path: Path) -> None:
    """A script named with Markdown and HTML, failing with a message that would end a table and
    open HTML: report.md shows both as text."""
    folder = tmp_path / "a|b <i>"
    folder.mkdir()
    script = folder / "train_`x`.py"
    script.write_text(
        "import torch\nm = torch.nn.Linear(2, 1)\nopt = torch.optim.SGD(m.parameters(), 0.1)\n"
        "for i in range(12):\n    m(torch.ones(4, 2)).sum().backward(); opt.step(); opt.zero_grad()\n"
        "    if i == 4:\n        raise RuntimeError('bad | row\\n</details><script>x()</script>')\n"
    )
    out = tmp_path / "r"
    code, _ = _cli("profile", "--warmup", "2", "--steps", "4", "--out", out, script, cwd=tmp_path)
    assert code == 3
    markdown = (out / "report.md").read_text()
    failure = r"**The script failed:** RuntimeError: bad \| row \</details\>\<script\>x()\</script\>"
    assert failure in markdown
    assert "<script>" not in markdown and "</details><" not in markdown
    [command_line] = [line for line in markdown.splitlines() if "train_" in line]
    assert command_line.startswith("``trainadvisor profile") and command_line.endswith("/train_`x`.py'``")


def test_a_script_stuck_without_a_timeout_is_stopped_showing_where(tmp_path: Path) -> None:
    out, script = tmp_path / "r", SCRIPTS / "hangs.py"
    options = ["--stall-timeout", "3", "--warmup", "2", "--steps", "20", "--out", str(out)]
    code, err = _cli("profile", *options, script, cwd=tmp_path)
    assert code == 3
    line = err.splitlines()[-1]
    assert line.startswith(
        f"trainadvisor: error: {script} failed: no training step or batch for 3 s (the longest gap "
    )
    assert (
        "the script looks stuck and was stopped; the script at hangs.py:13 in wait_for_peer (every thread's "
        "stack: logs/baseline.stacks.txt)" in line
    )
    stacks = (out / "logs" / "baseline.stacks.txt").read_text()
    assert 'hangs.py", line 13 in wait_for_peer' in stacks and 'hangs.py", line 18 in <module>' in stacks
    report = load_report(out)
    assert (
        report["baseline"]["raw"]["status"] == "script_failed"
        and report["baseline"]["raw"]["steps_seen"] == 8
    )
    assert processes_running(script, tmp_path) == []


def test_a_hung_rank_is_found_by_the_watchdog_and_every_rank_is_stopped(tmp_path: Path) -> None:
    """torchrun, rank 1 asleep at step 5 and rank 0 waiting for it in the all-reduce: each rank's
    place is named, and no rank, worker or launcher is left."""
    out, script = tmp_path / "r", EXAMPLES / "ddp_train.py"
    options = ["--nproc-per-node", "2", "--no-fix", "--stall-timeout", "5", "--warmup", "2", "--steps", "20"]
    code, err = _cli(
        "profile", *options, "--out", out, script, "--hang-rank", "1", cwd=tmp_path, timeout_s=240
    )
    assert code == 3
    line = err.splitlines()[-1]
    assert "no training step or batch for 5 s" in line and "the script looks stuck and was stopped" in line
    asleep = next(
        i for i, text in enumerate(script.read_text().splitlines(), 1) if "time.sleep(3600)" in text
    )
    assert f"rank 1 at ddp_train.py:{asleep} in main" in line and "rank 0 at ddp_train.py:" in line
    assert sorted(p.name for p in (out / "logs").glob("*.stacks.txt")) == [
        "baseline.rank0.stacks.txt", "baseline.rank1.stacks.txt",
    ]  # fmt: skip
    assert load_report(out)["baseline"]["raw"]["status"] == "script_failed"
    assert processes_running(script, tmp_path) == []


def test_sigterm_to_a_torchrun_job_stops_every_rank(tmp_path: Path) -> None:
    out, script = tmp_path / "r", EXAMPLES / "ddp_train.py"
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainadvisor", "profile", "--nproc-per-node", "2", "--no-fix",
         "--warmup", "2", "--steps", "100000", "--out", str(out), str(script), "--epochs", "1000"],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while len(processes_running(script, tmp_path)) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)  # torchrun and its two ranks
        time.sleep(3)  # the ranks are training
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143
    assert rest.splitlines()[-1] == "trainadvisor: interrupted; the script and its workers were stopped"
    assert processes_running(script, tmp_path) == []


def test_torchs_numpy_warning_is_not_shown_but_other_warnings_are() -> None:
    code = (
        "import warnings; from trainadvisor.measure.console import quiet_numpy_warning; "
        "quiet_numpy_warning(); warnings.warn(\"Failed to initialize NumPy: No module named 'numpy'\"); "
        "warnings.warn('the script says')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "NumPy" not in done.stderr and "UserWarning: the script says" in done.stderr


def test_a_script_that_prints_40_mib_leaves_a_log_of_32(tmp_path: Path) -> None:
    """A script printing a gigabyte filled 490 MB of a report folder with its log; a log keeps the
    first and last 16 MiB of what the script printed, its last line included."""
    from trainadvisor.measure.runner import RunSpec, measure

    script = tmp_path / "chatty.py"
    script.write_text(
        "import sys\nline = 'x' * (2**20 - 1) + '\\n'\nfor _ in range(40):\n    sys.stdout.write(line)\n"
        "print('THE END')\n"
    )
    raw = measure(RunSpec("chatty", script, [], tmp_path / "out", 2, 3, show_output=False, profile=False))
    log = (tmp_path / "out" / (raw.log_file or "")).read_bytes()
    assert 32 * 2**20 < len(log) < 32 * 2**20 + 200
    assert b"bytes of the script's output cut here" in log and log.rstrip().endswith(b"THE END")
