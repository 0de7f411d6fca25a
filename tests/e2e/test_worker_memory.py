"""What the sampler reads of a DataLoader worker's memory (`measure.sampling.OwnMemory`): its own
pages (USS), not the pages it still shares with the process it was forked from, which its RSS
counts too; a real forked process. When it reads: `tests/unit/measure/test_sampling.py`."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import psutil
import pytest

from trainadvisor.measure import sampling

MIB = 1 << 20
_FORKS = textwrap.dedent(
    """
    import os, sys, time
    shared = bytearray(256 << 20)
    for i in range(0, len(shared), 4096):  # resident, and shared with the worker forked next
        shared[i] = 1
    if os.fork() == 0:
        own = bytearray(64 << 20)
        for i in range(0, len(own), 4096):  # its own
            own[i] = 1
        sys.stdout.write("worker ready\\n")
        sys.stdout.flush()
        time.sleep(60)
        os._exit(0)
    time.sleep(60)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="USS is read from /proc/<pid>/smaps_rollup")
def test_a_workers_own_memory_leaves_out_the_pages_it_shares_with_the_training_process() -> None:
    """A process writes 256 MiB, then forks a worker that writes 64 MiB of its own: the worker's
    RSS counts both (320 MiB and more), its own memory the 64 MiB and the few pages the
    interpreter wrote since the fork."""
    parent = subprocess.Popen([sys.executable, "-c", _FORKS], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None and parent.stdout.readline() == "worker ready\n"
        sample = sampling.Sampler(parent.pid)._host_tick()
        assert sample is not None
        host = sample[1]
        assert host.workers == 1
        assert host.workers_rss_bytes >= 320 * MIB
        assert host.worker_uss_bytes is not None
        assert 64 * MIB <= host.worker_uss_bytes < 80 * MIB
    finally:
        for child in psutil.Process(parent.pid).children():
            child.kill()
        parent.kill()
        parent.wait()
