"""One reading of the machine's process table: each process's parent, name and CPU seconds.

The sampler needs three views of the machine every tick (the script's tree, trainadvisor's own
tree, and everything else), and psutil answers each with a scan of its own: `children()` reads
the stat file of every process on the machine to find the parents, and a busy machine was read
three times a tick. On a shared node of a few hundred processes, or in a test suite, that cost
a tenth of a core for sampling alone. Here one pass over `/proc/<pid>/stat` (Linux) gives all
three; elsewhere one `psutil.process_iter` does."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import psutil

PROC = Path("/proc")


@dataclass(frozen=True)
class ProcessTable:
    """pid -> parent pid, name (the kernel's, at most 15 characters on Linux), CPU seconds the
    process spent itself (`own_s`) and those of its children it has waited for (`reaped_s`)."""

    parent: dict[int, int] = field(default_factory=dict)
    name: dict[int, str] = field(default_factory=dict)
    own_s: dict[int, float] = field(default_factory=dict)
    reaped_s: dict[int, float] = field(default_factory=dict)

    @cached_property
    def _children(self) -> dict[int, list[int]]:
        """pid -> its children's pids, built once for the two or three trees a tick walks."""
        children: dict[int, list[int]] = {}
        for pid, parent in sorted(self.parent.items()):
            children.setdefault(parent, []).append(pid)
        return children

    def tree(self, root: int) -> list[int]:
        """`root` and its descendants at this reading, parents before their children; empty
        where `root` is not in the table (it has ended)."""
        if root not in self.parent:
            return []
        found, seen = [root], {root}
        for pid in found:  # grows as it is walked
            for child in self._children.get(pid, []):
                if child not in seen:  # a parent of its own (pid 0 in some tables)
                    seen.add(child)
                    found.append(child)
        return found


def read_table(proc: Path = PROC) -> ProcessTable:
    """The machine's processes as they are now; a process that ends while the table is read
    is left out."""
    if not proc.is_dir():
        return _from_psutil()
    ticks_per_s = os.sysconf("SC_CLK_TCK")
    table = ProcessTable()
    folder = str(proc)
    for entry in os.listdir(folder):
        if not entry.isdigit():
            continue
        try:
            with open(f"{folder}/{entry}/stat", "rb") as file:
                parsed = _parse_stat(file.read())
        except OSError:  # gone, or not ours to read
            continue
        if parsed is not None:
            pid = int(entry)
            table.name[pid], table.parent[pid], own, reaped = parsed
            table.own_s[pid], table.reaped_s[pid] = own / ticks_per_s, reaped / ticks_per_s
    return table


def _parse_stat(line: bytes) -> tuple[str, int, int, int] | None:
    """(name, parent pid, CPU ticks of the process, of its waited-for children) from a
    `/proc/<pid>/stat` line. The name is in parentheses and may hold spaces and parentheses of
    its own: the fields start after the last ')'."""
    opened, closed = line.find(b"("), line.rfind(b")")
    fields = line[closed + 2 :].split()
    if opened < 0 or closed < opened or len(fields) < 15:
        return None
    # after the name: state, ppid, pgrp, session, tty_nr, tpgid, flags, minflt, cminflt,
    # majflt, cmajflt, utime, stime, cutime, cstime (proc(5))
    try:
        utime, stime, cutime, cstime = map(int, fields[11:15])
        name = line[opened + 1 : closed].decode(errors="replace")
        return name, int(fields[1]), utime + stime, cutime + cstime
    except ValueError:
        return None


def _from_psutil() -> ProcessTable:
    """The table where there is no /proc (macOS, Windows): one psutil scan."""
    table = ProcessTable()
    for proc in psutil.process_iter(["ppid", "name", "cpu_times"]):
        times = proc.info.get("cpu_times")
        if times is None or proc.info.get("ppid") is None:
            continue
        table.parent[proc.pid] = proc.info["ppid"]
        table.name[proc.pid] = str(proc.info.get("name") or "?")
        table.own_s[proc.pid] = times.user + times.system
        table.reaped_s[proc.pid] = getattr(times, "children_user", 0.0) + getattr(
            times, "children_system", 0.0
        )
    return table
