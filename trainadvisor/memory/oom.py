"""A script that died of out-of-memory, summarised from what was there at the failing point:
the error's own figures ("Tried to allocate 128.00 MiB ... 3.17 GiB allowed; ... 3.06 GiB is
allocated by PyTorch"), the allocator's statistics and snapshot on a GPU
(`torch.cuda.memory_stats()`, `torch.cuda.memory._snapshot()`), and the storages the optimizer
owns. Pure: the child gathers the inputs (`training.failure`), the parent reads the facts
(`oom_measurements`), and tests feed it snapshots recorded on a GPU.

A snapshot's live blocks carry the stack that allocated them only where the allocator's history
was being recorded at the time (`torch.cuda.memory._record_memory_history`); the others are
counted as unattributed."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

SITES_SHOWN = 5  # the largest allocation sites kept in the facts
STACK_SHOWN = 4  # user frames kept of a site's stack, innermost first

# torch's CUDA error: "CUDA out of memory. Tried to allocate 128.00 MiB. GPU 0 has a total
# capacity of 79.18 GiB of which 75.38 GiB is free. Including non-PyTorch memory, this process
# has 3.79 GiB memory in use. 3.17 GiB allowed; Of the allocated memory 3.06 GiB is allocated by
# PyTorch, and 1.81 MiB is reserved by PyTorch but unallocated." (torch 2.x); before torch 2.1:
# "Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; 14.56 GiB already allocated;
# 3.44 MiB free; 14.74 GiB reserved in total by PyTorch)". The CPU allocator's: "DefaultCPUAllocator:
# can't allocate memory: you tried to allocate 100000000000000 bytes."
_SIZE = r"([0-9]+(?:\.[0-9]+)?) ?(bytes|B|KiB|MiB|GiB|TiB)"
_FIGURES = {
    "request_bytes": (rf"Tried to allocate {_SIZE}", r"you tried to allocate ([0-9]+) (bytes)"),
    "device_total_bytes": (rf"total capacity of {_SIZE}", rf"{_SIZE} total capacity"),
    "device_free_bytes": (rf"of which {_SIZE} is free", rf"{_SIZE} free\)?"),
    "process_used_bytes": (rf"this process has {_SIZE} memory in use",),
    "allowed_bytes": (rf"{_SIZE} allowed",),
    "allocated_bytes": (rf"{_SIZE} is allocated by PyTorch", rf"{_SIZE} already allocated"),
    "reserved_unallocated_bytes": (rf"{_SIZE} is reserved by PyTorch but unallocated",),
    "reserved_bytes": (rf"{_SIZE} reserved in total by PyTorch",),
}
_UNITS = {"bytes": 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_CPU_ALLOCATOR = "can't allocate memory"
# Paths of code that is not the user's, as a snapshot recorded on another machine writes them.
_NOT_USER_PARTS = ("site-packages", "dist-packages")


# The GPU running out of memory outside the caching allocator: the driver's own error (a kernel's
# launch, a context), and the libraries' workspace allocations failing inside a call.
_GPU_OUT_OF_MEMORY = re.compile(
    r"CUDA error: out of memory|CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED|"
    r"CUDNN_STATUS_NOT_ENOUGH_WORKSPACE|HIP error: out of memory|hipErrorOutOfMemory"
)


def kind_of(type_name: str, message: str) -> str | None:
    """Which memory ran out: "cuda" for a GPU allocator's refusal (`torch.OutOfMemoryError`, alias
    `torch.cuda.OutOfMemoryError`, or a RuntimeError of older torch with its text) or the driver's
    and the libraries' ("CUDA error: out of memory", cuBLAS's and cuDNN's allocation failures),
    "host" for host memory (Python's MemoryError, torch's CPU allocator refusing); None for any
    other error."""
    if type_name == "OutOfMemoryError" or message.startswith("CUDA out of memory"):
        return "host" if _CPU_ALLOCATOR in message else "cuda"
    if type_name in ("RuntimeError", "AcceleratorError") and _GPU_OUT_OF_MEMORY.search(message):
        return "cuda"
    if type_name == "MemoryError" or (type_name == "RuntimeError" and _CPU_ALLOCATOR in message):
        return "host"
    return None


def message_figures(message: str) -> dict[str, int]:
    """The figures an out-of-memory error states, in bytes (rounded as the message rounds them:
    "3.06 GiB" is within 5 MiB)."""
    figures: dict[str, int] = {}
    for name, patterns in _FIGURES.items():
        for pattern in patterns:
            found = re.search(pattern, message)
            if found is not None:
                figures[name] = round(float(found.group(1)) * _UNITS[found.group(2)])
                break
    return figures


def is_user_file(filename: str, not_user: tuple[str, ...] = ()) -> bool:
    """Whether a frame's file is the user's code: a Python file outside installed packages, the
    standard library and the folders in `not_user` (torch's and trainadvisor's, where the
    snapshot was taken on this machine)."""
    if filename.startswith("<") or not filename.endswith(".py"):
        return False  # C++ frames ("??", "x.cpp"), "<frozen runpy>", "<string>"
    path = os.path.normpath(filename)
    parts = path.split(os.sep)
    if any(part in _NOT_USER_PARTS for part in parts):
        return False
    if any(part.startswith("python3") for part in parts[:-1]) and "lib" in parts:  # the stdlib
        return False
    return not any(path.startswith(prefix) for prefix in not_user)


def user_stack(frames: Iterable[dict[str, Any]], not_user: tuple[str, ...] = ()) -> list[str]:
    """'train.py:42' of each user frame, innermost first (frames as the snapshot lists them)."""
    return [
        f"{os.path.basename(str(f.get('filename', '')))}:{f.get('line', 0)}"
        for f in frames
        if is_user_file(str(f.get("filename", "")), not_user)
    ]


@dataclass(frozen=True)
class Block:
    """One live allocation of the snapshot."""

    address: int
    size_bytes: int
    stack: tuple[str, ...]  # user frames, innermost first; () where none was recorded


def live_blocks(
    snapshot: dict[str, Any], device: int | None = None, not_user: tuple[str, ...] = ()
) -> list[Block]:
    """The snapshot's allocated blocks (on `device`, where given)."""
    blocks = []
    for segment in snapshot.get("segments") or []:
        if device is not None and segment.get("device", device) != device:
            continue
        for block in segment.get("blocks") or []:
            if block.get("state") == "active_allocated":
                stack = tuple(user_stack(block.get("frames") or [], not_user))
                blocks.append(Block(int(block["address"]), int(block["size"]), stack))
    return blocks


@dataclass
class Site:
    """The live blocks allocated at one line of the user's code."""

    site: str
    bytes: int = 0
    blocks: int = 0
    holds: dict[str, int] = field(default_factory=dict)  # bytes by what they are (`parameters`...)
    stack: list[str] = field(default_factory=list)  # the stack of its largest block

    def facts(self) -> dict[str, Any]:
        held = max(self.holds.items(), key=lambda kv: kv[1])[0] if self.holds else ""
        return {
            "site": self.site,
            "bytes": self.bytes,
            "blocks": self.blocks,
            "holds": held,
            "stack": self.stack,
        }


def largest_sites(
    blocks: list[Block], owned: dict[int, str] | None = None, shown: int = SITES_SHOWN
) -> list[dict[str, Any]]:
    """The user lines whose live blocks hold the most bytes, largest first. `owned`: what a
    block's address holds where the optimizer knows it ("parameters", "gradients",
    "optimizer_state"); a site's `holds` is what most of its bytes are."""
    sites: dict[str, Site] = {}
    largest: dict[str, int] = {}
    for block in blocks:
        if not block.stack:
            continue
        site = sites.setdefault(block.stack[0], Site(block.stack[0]))
        site.bytes += block.size_bytes
        site.blocks += 1
        if owned:  # what the block holds, where the optimizer's storages are known
            what = owned.get(block.address, "other")
            site.holds[what] = site.holds.get(what, 0) + block.size_bytes
        if block.size_bytes > largest.get(site.site, -1):
            largest[site.site] = block.size_bytes
            site.stack = list(block.stack[:STACK_SHOWN])
    ranked = sorted(sites.values(), key=lambda s: (-s.bytes, s.site))
    return [s.facts() for s in ranked[:shown]]


def _oom_event(snapshot: dict[str, Any], device: int | None) -> dict[str, Any] | None:
    """The allocator's record of the refused request (with the history on): its size and the
    device's free bytes at that moment."""
    traces = snapshot.get("device_traces") or []
    index = device if device is not None and device < len(traces) else 0
    events = traces[index] if traces else []
    return next((e for e in reversed(events) if e.get("action") == "oom"), None)


def breakdown(live_bytes: int, owned_bytes: dict[str, int]) -> dict[str, int]:
    """What was live at the failing point: the optimizer's parameters, gradients and state
    (exact, from its tensors), and the rest (activations kept for backward and temporaries)."""
    parts = {name: int(size) for name, size in owned_bytes.items()}
    parts["other"] = max(live_bytes - sum(parts.values()), 0)
    return parts


def summarise_cuda(
    message: str,
    stats: dict[str, Any],
    snapshot: dict[str, Any] | None,
    device: int | None = None,
    owned: dict[int, tuple[str, int]] | None = None,
    limit: tuple[int, str] | None = None,
    not_user: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The facts of a CUDA out-of-memory: the failed request, the bytes live and reserved
    (exact, from the statistics; else the message's), what the allocator may use (`limit`,
    else what the message states), the breakdown where the optimizer is known (`owned`:
    address -> (what, bytes) of its storages) and the largest live allocation sites (where the
    history recorded their stacks)."""
    figures = message_figures(message)
    facts: dict[str, Any] = {"kind": "cuda", "message_figures": figures}
    live = stats.get("allocated_bytes.all.current", figures.get("allocated_bytes"))
    reserved = stats.get("reserved_bytes.all.current", figures.get("reserved_bytes"))
    facts["request_bytes"] = figures.get("request_bytes")
    facts["live_bytes"] = int(live) if live is not None else None
    facts["reserved_bytes"] = int(reserved) if reserved is not None else None
    if limit is None:
        stated = figures.get("allowed_bytes") or figures.get("device_total_bytes")
        source = "allowed, as the error states" if "allowed_bytes" in figures else "the card's capacity"
        limit = (stated, source) if stated else None
    if limit is not None:
        facts["limit_bytes"], facts["limit_source"] = limit
    owned = owned or {}
    if owned and facts["live_bytes"] is not None:
        totals: dict[str, int] = {}
        for what, size in owned.values():
            totals[what] = totals.get(what, 0) + size
        facts["breakdown"] = breakdown(facts["live_bytes"], totals)
    if snapshot is not None:
        facts.update(_snapshot_facts(snapshot, device, {a: w for a, (w, _) in owned.items()}, not_user))
    return facts


def _snapshot_facts(
    snapshot: dict[str, Any], device: int | None, owned: dict[int, str], not_user: tuple[str, ...]
) -> dict[str, Any]:
    blocks = live_blocks(snapshot, device, not_user)
    attributed = sum(b.size_bytes for b in blocks if b.stack)
    facts: dict[str, Any] = {
        "snapshot_live_bytes": sum(b.size_bytes for b in blocks),
        "largest_sites": largest_sites(blocks, owned),
        "unattributed_bytes": sum(b.size_bytes for b in blocks) - attributed,
    }
    event = _oom_event(snapshot, device)
    if event is not None:  # exact, where the message rounds
        facts["request_bytes"] = int(event["size"])
        facts["request_site"] = next(iter(user_stack(event.get("frames") or [], not_user)), "")
    return facts


def summarise_host(
    message: str, owned_bytes: dict[str, int], process_bytes: int | None, limit: tuple[int, str] | None
) -> dict[str, Any]:
    """The facts of a host out-of-memory: the request where the error states it, what the
    process held (its resident memory: the interpreter and libraries too, so the optimizer's
    tensors are given as they are, with no rest called activations), and the limit (the
    address-space limit a job scheduler imposes, else the machine's memory)."""
    figures = message_figures(message)
    facts: dict[str, Any] = {
        "kind": "host",
        "message_figures": figures,
        "request_bytes": figures.get("request_bytes"),
    }
    facts["live_bytes"] = process_bytes
    if limit is not None:
        facts["limit_bytes"], facts["limit_source"] = limit
    if owned_bytes:
        facts["breakdown"] = dict(owned_bytes)
    return facts


def _size(value: float) -> str:
    """Bytes as torch's errors write them (binary units, two decimals)."""
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        if value >= _UNITS[unit]:
            return f"{value / _UNITS[unit]:.2f} {unit}"
    return f"{value:.0f} bytes"


def sites_text(sites: list[dict[str, Any]]) -> str:
    """'residual_stack.py:16 (2.25 GiB in 47 blocks, from train_oom.py:20); ...'"""
    parts = []
    for s in sites:
        what = f"{_size(s['bytes'])} in {s['blocks']} block{'s' if s['blocks'] != 1 else ''}"
        if s.get("holds") and s["holds"] != "other":
            what += f", {s['holds'].replace('_', ' ')}"
        outer = s.get("stack", [])[1:]
        if outer:
            what += f", from {' < '.join(outer)}"
        parts.append(f"{s['site']} ({what})")
    return "; ".join(parts)


def oom_measurements(facts: dict[str, Any]) -> dict[str, Any]:
    """The named measurements the out-of-memory rule reads: `out_of_memory`, `oom_memory`
    ("GPU memory" or "host memory"), the request, the live, reserved and limit bytes, the
    breakdown's parts (`oom_parameters_bytes`...), the largest allocation sites in words
    (`oom_largest_sites`), and the line whose request failed (`oom_failed_site`)."""
    if not facts:
        return {}
    table: dict[str, Any] = {
        "out_of_memory": True,
        "oom_memory": "GPU memory" if facts.get("kind") == "cuda" else "host memory",
    }
    for key in ("request_bytes", "live_bytes", "reserved_bytes", "limit_bytes", "unattributed_bytes"):
        if facts.get(key) is not None:
            table[f"oom_{key}"] = facts[key]
    for part, size in (facts.get("breakdown") or {}).items():
        table[f"oom_{part}_bytes"] = size
        if facts.get("live_bytes"):
            table[f"oom_{part}_pct"] = 100.0 * size / facts["live_bytes"]
    if facts.get("limit_bytes") and facts.get("live_bytes") is not None:
        table["oom_live_pct"] = 100.0 * facts["live_bytes"] / facts["limit_bytes"]
    if facts.get("largest_sites"):
        table["oom_largest_sites"] = sites_text(facts["largest_sites"])
    site = facts.get("failed_site") or facts.get("request_site")
    if site:
        table["oom_failed_site"] = site
    table["oom_summary"] = summary_text(facts)
    return table


def summary_text(facts: dict[str, Any]) -> str:
    """What the allocator was asked and had, in words: 'it asked for 128.00 MiB more with 3.06
    GiB already allocated, of the 3.17 GiB it may use (...)'."""
    parts = []
    if facts.get("request_bytes") is not None:
        parts.append(f"it asked for {_size(facts['request_bytes'])} more")
    if facts.get("live_bytes") is not None:
        held = "already allocated" if facts.get("kind") == "cuda" else "held by the process"
        parts.append(f"with {_size(facts['live_bytes'])} {held}")
    if facts.get("limit_bytes") and parts:
        parts[-1] += ","
        parts.append(f"of the {_size(facts['limit_bytes'])} it may use ({facts.get('limit_source', '')})")
    return " ".join(parts) if parts else "the error states no figures"
