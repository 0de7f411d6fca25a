"""One reading of the machine's process table: each process's parent, name and CPU seconds.

The sampler needs three views of the machine every tick (the script's tree, trainadvisor's own
tree, and everything else), and psutil answers each with a scan of its own: `children()` reads
the stat file of every process on the machine to find the parents, and a busy machine was read
three times a tick. On a shared node of a few hundred processes, or in a test suite, that cost
a tenth of a core for sampling alone. Here one pass over `/proc/<pid>/stat` (Linux) gives all
three; elsewhere one `psutil.process_iter` does. Where the kernel lists each thread's children
(`/proc/<pid>/task/<tid>/children`), trainadvisor's own tree is read alone (`read_tree`): a few
files a tick however many processes the machine runs; the whole table is then read only to name
the processes that keep the machine busy."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import psutil

PROC = Path("/proc")
_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # Linux's clock ticks


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
    table, folder = ProcessTable(), str(proc)
    for entry in os.listdir(folder):
        if entry.isdigit():
            _add(table, folder, int(entry))
    return table


def read_tree(roots: list[int], proc: Path = PROC, known: Iterable[int] = ()) -> ProcessTable | None:
    """The `roots` and their descendants alone, found through the children each of their
    threads started (`/proc/<pid>/task/<tid>/children`); None where the kernel keeps no such
    lists (built without CONFIG_PROC_CHILDREN, or no /proc): read the whole table there. A root
    that has ended is not in it. `known`: the tree's members at the last reading. The lists may
    skip a live child while a sibling is reaped (proc(5)); one still running under a parent in
    the tree is read directly, with its descendants, not taken for ended (its CPU would count
    as another process's for a tick, and as new at the next)."""
    folder = str(proc)
    if not os.path.exists(f"{folder}/{os.getpid()}/task/{os.getpid()}/children"):
        return None
    table, seen = ProcessTable(), set[int]()
    _walk(table, folder, list(dict.fromkeys(roots)), seen)  # under @advise: one root twice
    for pid in known:
        if pid not in seen:
            probe = ProcessTable()
            if _add(probe, folder, pid) and probe.parent[pid] in table.parent:
                _walk(table, folder, [pid], seen)
    return table


def _walk(table: ProcessTable, folder: str, found: list[int], seen: set[int]) -> None:
    """`found` and their descendants into the table."""
    seen.update(found)
    for pid in found:  # grows as it is walked
        if not _add(table, folder, pid):
            continue  # ended meanwhile: its children are left to the next reading
        for child in _children_of(folder, pid):
            if child not in seen:
                seen.add(child)
                found.append(child)


def _children_of(folder: str, pid: int) -> list[int]:
    """The children every thread of `pid` started (a thread or process that ended meanwhile
    lists none)."""
    children: list[int] = []
    try:
        threads = os.listdir(f"{folder}/{pid}/task")
    except OSError:
        return children
    for tid in threads:
        try:
            with open(f"{folder}/{pid}/task/{tid}/children", "rb") as file:
                children.extend(int(word) for word in file.read().split())
        except (OSError, ValueError):
            continue
    return children


def _add(table: ProcessTable, folder: str, pid: int) -> bool:
    """`pid`'s stat line into the table; False where it is gone, or not ours to read."""
    try:
        with open(f"{folder}/{pid}/stat", "rb") as file:
            parsed = _parse_stat(file.read())
    except OSError:
        return False
    if parsed is None:
        return False
    table.name[pid], table.parent[pid], own, reaped = parsed
    table.own_s[pid], table.reaped_s[pid] = own / _TICKS_PER_S, reaped / _TICKS_PER_S
    return True


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
