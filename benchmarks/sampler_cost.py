"""What host sampling costs trainadvisor's process: CPU milliseconds per tick of the sampler, on
a machine with a given number of other processes.

    .venv/bin/python benchmarks/sampler_cost.py [--others 200] [--seconds 5]

A sleeping "script" with four sleeping workers is sampled every 0.1 s (the runs' interval) for
`--seconds`, beside `--others` sleeping processes outside the benchmark's own tree (a shared
node, a test suite: they are started by a process that then exits), and once more
with a busy loop beside it, where the sampler also names the busiest other processes. The CPU
is this process's own over the sampling (its main thread sleeps), divided by the ticks taken."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

import psutil

from trainadvisor.measure.proctable import read_table
from trainadvisor.measure.sampling import Sampler

SLEEPER = "import time; time.sleep(600)"
# starts `n` sleepers, prints their pids, and exits: they belong to no tree of the benchmark's
DETACHED = (
    "import subprocess, sys; n = int(sys.argv[1]); "
    "print(' '.join(str(subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], "
    "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid) for _ in range(n)))"
)
SCRIPT = "import subprocess, sys, time; [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']) for _ in range(4)]; time.sleep(600)"  # noqa: E501


def per_tick_ms(pid: int, seconds: float) -> tuple[float, int]:
    sampler = Sampler(pid)
    started = time.process_time()
    sampler.start()
    time.sleep(seconds)
    sampler.stop()
    return 1e3 * (time.process_time() - started) / max(1, len(sampler.host)), len(sampler.host)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--others", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    launched = subprocess.run(
        [sys.executable, "-c", DETACHED, str(args.others)], capture_output=True, text=True
    )
    others = [int(pid) for pid in launched.stdout.split()]
    script = subprocess.Popen([sys.executable, "-c", SCRIPT])
    try:
        time.sleep(2.0)  # every process started
        print(f"processes on the machine: {len(read_table().parent)}")
        quiet_ms, ticks = per_tick_ms(script.pid, args.seconds)
        print(f"sampler, quiet machine: {quiet_ms:.2f} ms CPU per tick ({ticks} ticks)")
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            busy_ms, ticks = per_tick_ms(script.pid, args.seconds)
        finally:
            busy.kill()
            busy.wait()
        print(f"sampler, a busy loop beside it: {busy_ms:.2f} ms CPU per tick ({ticks} ticks)")
    finally:
        for worker in psutil.Process(script.pid).children():
            worker.kill()
        script.kill()
        script.wait()
        for pid in others:
            os.kill(pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
