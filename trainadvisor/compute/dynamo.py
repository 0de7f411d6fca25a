"""What torch.compile did in the script's own process: its graph breaks (the reason, and the
line of the user's code where each happened), its recompilations (the guard that failed) and the
time it spent compiling. Read from dynamo's own records, never from its console output:

- `torch._dynamo.utils.graph_break_reasons` (torch 2.1+): a `GraphCompileReason` per graph
  break, with its reason and the user stack (`traceback.FrameSummary`s) dynamo traced it in; it
  also holds the data-dependent branches (`if tensor:`) that `counters["graph_break"]` misses;
- `torch._dynamo.utils.counters` (2.1+): `["graph_break"]` by reason, `["stats"]["unique_graphs"]`,
  `["frames"]["total"]`, and in `["unimplemented"]` the frames that hit the recompile limit;
- `torch._dynamo.convert_frame.FRAME_COMPILE_COUNTER` (2.1+): compilations by frame id;
- `torch._dynamo.utils.guard_failures` (2.3+ always; 2.1-2.2 only with
  TORCHDYNAMO_REPORT_GUARD_FAILURES=1): the failed guards' text, by the code object recompiled;
- `torch._dynamo.utils.calculate_time_spent()` (2.5+) or `compilation_time_metrics` (2.1+):
  the time spent compiling.

Each of these is private to torch: every read is guarded, and a record that is missing or has
changed shape gives fewer details, never an error in the user's training. `compile_facts` runs
in the script's process; `compile_measurements` turns its facts into named measurements (pure)."""

from __future__ import annotations

import functools
import os
import re
import sys
import sysconfig
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

# reasons and sites kept in the facts, most frequent first (a report names the first few)
MOST = 10

_PACKAGE = str(Path(__file__).resolve().parents[1])
# the compile id that prefixes a guard failure from torch 2.5 on: "3/1: ...", "[!0/2]: ..."
_COMPILE_ID = re.compile(r"^\s*\[?!?(?P<frame>\d+)/(?P<compile>\d+)(?:_\d+)?\]?:\s*")
# a guard's values (sizes, ids, constants) that change from one recompilation to the next
_VALUES = re.compile(r"(expected|actual|==|!=|<=|>=|<|>|,)\s*-?\d+(?:\.\d+)?(?:e-?\d+)?")
# the source line torch 2.6+ writes after a guard ("x == 3  # if n > 2:  # train.py:9 in f")
_SOURCE_NOTE = re.compile(r"\s+#\s.*$")
# `torch_dynamo_resume_in_forward_at_11`: the rest of `forward` after its graph break at line 11
_RESUME = re.compile(r"^torch_dynamo_resume_in_(?P<func>.+)_at_\d+$")
# The limit hit, as counters["unimplemented"] names it: "cache_size_limit reached" (2.1-2.5),
# "recompile_limit reached", "Dynamo recompile limit exceeded ..." (2.7+).
_LIMIT_HIT = re.compile(r"(cache_size_limit|recompile_limit) reached|recompile limit exceeded", re.I)
# reasons whose text says little to a user, in words that do
_PLAIN = {"generic_jump": "a Python branch (if/while) on a tensor's value"}


def compile_facts() -> dict[str, Any]:
    """What torch.compile did in this process so far (JSON-plain values), {} when the script
    never compiled. Cheap: it reads dynamo's records and imports nothing that was not imported.

    Keys: `compiled_graphs`; `graph_breaks` (total) and `graph_break_sites` ({reason, site
    "file:line" in the user's code, function, count}, most frequent first); `recompilations`
    and `recompile_reasons` ({reason: the failed guard, site "file:line" of the function
    recompiled, function, count}); `recompile_limit` and `recompile_limit_hits` (frames that
    hit it and run uncompiled since); `compile_s` (time spent compiling); `run_s` (the
    process's age, the share's denominator); `compile_cache_hits` and `compile_cache_misses`
    (graphs read from torch's on-disk caches, and compiled)."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:  # torch._dynamo never imported: nothing was compiled
        return {}
    return _safely(lambda: _read(utils), {})


def _read(utils: Any) -> dict[str, Any]:
    counters: dict[str, dict[str, int]] = {k: dict(v) for k, v in list(utils.counters.items())}
    frames = counters.get("frames", {}).get("total", 0)
    graphs = counters.get("stats", {}).get("unique_graphs", 0)
    if not frames and not graphs:  # imported (by a library, say) but never compiled a frame
        return {}
    empty: list[dict[str, Any]] = []
    sites = _safely(lambda: break_sites(getattr(utils, "graph_break_reasons", [])), empty)
    counted = sum(counters.get("graph_break", {}).values())
    if not sites and counted:  # no stacks recorded: the reasons alone
        sites = [{"reason": _short(r), "site": None, "function": None, "count": n} for r, n in
                 sorted(counters["graph_break"].items(), key=lambda item: -item[1])]  # fmt: skip
    reasons = _safely(lambda: recompile_reasons(getattr(utils, "guard_failures", {})), empty)
    facts: dict[str, Any] = {
        "compiled_graphs": int(graphs),
        # graph_break_reasons holds every break; the counter misses data-dependent branches
        "graph_breaks": max(sum(s["count"] for s in sites), counted),
        "graph_break_sites": sites[:MOST],
        "recompilations": _safely(_recompilations, None),
        "recompile_reasons": reasons[:MOST],
        "recompile_limit": _safely(_recompile_limit, None),
        "recompile_limit_hits": sum(
            n for r, n in counters.get("unimplemented", {}).items() if _LIMIT_HIT.search(r)
        ),
        "compile_s": _safely(lambda: compile_seconds(utils), None),
        "run_s": _safely(_process_age_s, None),
        **_cache_counts(counters),
    }
    if facts["recompilations"] is None:  # no compile counter: one recompilation per guard failure
        facts["recompilations"] = sum(r["count"] for r in reasons)
    return {k: v for k, v in facts.items() if v is not None}


def _cache_counts(counters: dict[str, dict[str, int]]) -> dict[str, int]:
    """How many compiled graphs came from torch's on-disk caches (inductor's FX graphs,
    AOTAutograd's) and how many were compiled: a compile of cached graphs is much faster than
    one on a machine that never compiled them (`compile_cache_hits`, `compile_cache_misses`)."""
    inductor, aot = counters.get("inductor", {}), counters.get("aot_autograd", {})
    hits = inductor.get("fxgraph_cache_hit", 0) + aot.get("autograd_cache_hit", 0)
    misses = inductor.get("fxgraph_cache_miss", 0) + aot.get("autograd_cache_miss", 0)
    return {"compile_cache_hits": hits, "compile_cache_misses": misses} if hits or misses else {}


def _safely(read: Callable[[], T], default: T) -> T:
    """A read of torch's private records: whatever it raises (a record renamed, reshaped or
    mutated while read), the facts go on without it."""
    try:
        return read()
    except Exception:
        return default


# ---- graph breaks ----


def break_sites(reasons: Iterable[Any]) -> list[dict[str, Any]]:
    """Graph breaks by (reason, user site), most frequent first: each `GraphCompileReason`'s
    innermost frame of the user's own code (a break inside torch or a library is placed at the
    user's line that called into it)."""
    counts: dict[tuple[str, str | None, str | None], int] = {}
    for reason in list(reasons):
        if not getattr(reason, "graph_break", True):
            continue
        frame = user_frame(getattr(reason, "user_stack", None) or [])
        site = f"{_path(frame.filename)}:{frame.lineno}" if frame is not None else None
        key = (_short(str(getattr(reason, "reason", ""))), site, getattr(frame, "name", None))
        counts[key] = counts.get(key, 0) + 1
    ordered = sorted(counts.items(), key=lambda item: -item[1])
    return [{"reason": r, "site": s, "function": f, "count": n} for (r, s, f), n in ordered]


def user_frame(stack: list[Any]) -> Any:
    """The innermost frame of the user's code in a stack (outermost first); the innermost frame
    when all of it is library code (a compiled model from site-packages)."""
    frames = [f for f in stack if getattr(f, "filename", None) and getattr(f, "lineno", None)]
    users = [f for f in frames if not _library(f.filename)]
    return (users or frames or [None])[-1]


def _library(filename: str) -> bool:
    path = os.path.abspath(filename)
    if any(part in path for part in (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")):
        return True
    return filename.startswith("<frozen") or any(path.startswith(root + os.sep) for root in _library_roots())


@functools.lru_cache(maxsize=1)
def _library_roots() -> tuple[str, ...]:
    """torch's folder (a source checkout is not in site-packages), ours, Python's own."""
    torch = sys.modules.get("torch")
    roots = [_PACKAGE, os.path.dirname(getattr(torch, "__file__", None) or "")]
    roots += [sysconfig.get_paths().get(k, "") for k in ("stdlib", "platstdlib")]
    return tuple(root for root in roots if root)


def _path(filename: str) -> str:
    """A file under the working directory by its relative path, as the user would name it."""
    path = os.path.abspath(filename)
    cwd = os.getcwd()
    return os.path.relpath(path, cwd) if path.startswith(cwd + os.sep) else filename


def _short(reason: str) -> str:
    """A reason in one line: recent torch (2.13) writes a graph break as its type, then an
    "Explanation:" line that says what happened, then hints; older torch (2.1, 2.5) one line."""
    lines = [line.strip() for line in reason.strip().splitlines() if line.strip()]
    if not lines:
        return "unknown"
    explained = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("Explanation:")), None)
    first = lines[0]
    plain = _PLAIN.get(first.split(" ", 1)[0])
    return plain or explained or first


# ---- recompilations ----


def recompile_reasons(guard_failures: Any) -> list[dict[str, Any]]:
    """The guards whose failure made dynamo recompile, by (function, guard), most frequent
    first; the reason is the latest one's text (its values: the size seen last, say)."""
    grouped: dict[tuple[str, str], dict[str, Any]] = {}
    for code, failures in list(guard_failures.items()):
        name = str(getattr(code, "co_name", "?"))
        resumed = _RESUME.match(name)
        function = resumed["func"] if resumed else name
        site = f"{_path(str(getattr(code, 'co_filename', '?')))}:{getattr(code, 'co_firstlineno', 0)}"
        for failure in one_per_recompile([str(f) for f in list(failures)]):
            text = _guard_text(failure)
            entry = grouped.setdefault((site, _VALUES.sub(r"\1 N", text)), {"count": 0})
            entry.update(reason=text, site=site, function=function, count=entry["count"] + 1)
    ordered = sorted(grouped.values(), key=lambda e: -e["count"])
    return [{k: e[k] for k in ("reason", "site", "function", "count")} for e in ordered]


def one_per_recompile(failures: list[str]) -> list[str]:
    """One guard failure per recompilation. torch 2.1 records one (the newest cache entry's);
    2.3+ records one per cache entry checked, newest first, and from 2.5 on prefixes each with
    the entry's compile id ("3/2: ...", "3/1: ...", "3/0: ..."): a recompilation's failures are a
    run of falling ids, the first of them against the newest entry. Without ids (2.3-2.4) every
    failure counts: more than the recompilations when several entries were cached."""
    heads = []
    previous: int | None = None
    for failure in failures:
        found = _COMPILE_ID.match(failure)
        entry = int(found["compile"]) if found else None
        if entry is None or previous is None or entry >= previous:
            heads.append(failure)
        previous = entry
    return heads


def _guard_text(failure: str) -> str:
    """The failed guard alone: without its compile id and the user stack torch 2.9+ appends."""
    text = _COMPILE_ID.sub("", failure, count=1).strip()
    first = text.split("\nUser stack trace:", 1)[0].splitlines()[0] if text else ""
    return _SOURCE_NOTE.sub("", first).strip() or "unknown"


def _recompilations() -> int | None:
    """Compilations of a frame after its first, by dynamo's compile ids (`frame/compile`, the
    second number counted per frame in FRAME_COMPILE_COUNTER). From torch 2.5 on the attempt
    that finds the recompile limit reached has its id too, so it counts (not in 2.1-2.3)."""
    convert_frame = sys.modules.get("torch._dynamo.convert_frame")
    counter = getattr(convert_frame, "FRAME_COMPILE_COUNTER", None)
    if counter is None:
        return None
    return sum(max(int(n) - 1, 0) for n in list(counter.values()) if isinstance(n, int))


def _recompile_limit() -> int | None:
    config = sys.modules.get("torch._dynamo.config")
    for name in ("recompile_limit", "cache_size_limit"):  # renamed in torch 2.6
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


# ---- time ----


def compile_seconds(utils: Any) -> float | None:
    """Time spent compiling so far: dynamo's `calculate_time_spent()["total_wall_time"]` (torch
    2.5+: each frame's `entire_frame_compile`, its tracing with the backend's forward compile
    inside, and the backward's compile: `inductor_compile` in 2.5, `entire_backward_compile` in
    2.13); before it, the `compile_inner` entries of `compilation_time_metrics` (the frames'
    compiles: a backward compiled lazily at its first call is not in them)."""
    spent = getattr(utils, "calculate_time_spent", None)
    if callable(spent):
        total = spent().get("total_wall_time")
        if isinstance(total, (int, float)):
            return round(float(total), 4)
    metrics = getattr(utils, "compilation_time_metrics", None) or {}
    times = [t for key, ts in list(metrics.items()) if key.endswith("compile_inner") for t in ts]
    return round(float(sum(times)), 4) if times else None


def _process_age_s() -> float:
    import psutil  # a dependency; imported here so the module costs nothing until read

    return round(time.time() - psutil.Process().create_time(), 3)


# ---- measurements (pure: from saved facts) ----


def _placed(name: str, listed: str, found: list[dict[str, Any]]) -> dict[str, Any]:
    """The most frequent record's `<name>_site` and `<name>_reason`, and the first three in
    words under `listed` ({} where there are none)."""
    if not found:
        return {}
    return {
        f"{name}_site": _where(found[0]),
        f"{name}_reason": found[0]["reason"],
        listed: "; ".join(f"{_where(r)}: {r['reason']} (x{r['count']})" for r in found[:3]),
    }


def compile_measurements(facts: dict[str, Any]) -> dict[str, Any]:
    """Named measurements from `compile_facts` (saved as `runtime["compile"]`); none for a run
    that never compiled."""
    if not facts:
        return {}
    table: dict[str, Any] = {"compiled": True}
    for key in ("compiled_graphs", "graph_breaks", "recompilations", "recompile_limit", "compile_s"):
        if facts.get(key) is not None:
            table[key] = facts[key]
    table["recompile_limit_hits"] = facts.get("recompile_limit_hits", 0)
    if facts.get("compile_s") is not None and facts.get("run_s"):
        table["compile_pct"] = 100.0 * facts["compile_s"] / facts["run_s"]
    table.update(_placed("graph_break", "graph_break_sites", facts.get("graph_break_sites") or []))
    reasons = facts.get("recompile_reasons") or []
    if reasons:
        table.update(_placed("recompile", "recompile_reasons", reasons))
    elif table.get("recompilations"):  # torch 2.1-2.2 without TORCHDYNAMO_REPORT_GUARD_FAILURES
        table["recompile_site"] = "a compiled function"
        table["recompile_reason"] = (
            "not recorded by this torch (TORCHDYNAMO_REPORT_GUARD_FAILURES=1 records it)"
        )
    return table


def _where(entry: dict[str, Any]) -> str:
    site, function = entry.get("site"), entry.get("function")
    if site is None:
        return "an unrecorded line"
    return f"{site} (in {function})" if function else site
