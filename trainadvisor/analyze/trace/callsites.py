"""Where in the user's code a traced event came from: the innermost user frame of a trace
recorded with Python stacks, and the line of the torch call in it when the source can be read."""

from __future__ import annotations

import ast
import bisect
import functools
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainadvisor.analyze.trace.copies import FACTORY_CALLS

if TYPE_CHECKING:
    from trainadvisor.analyze.trace.trace_records import Facts

# Python frames (`file.py(first line): function`) of libraries, not of the user's code.
FRAME = re.compile(r"^(?P<file>[^<][^(]*)\((?P<line>\d+)\): (?P<func>.+)$")
BUILTIN = re.compile(r"^<built-in (?:method|function) (?P<name>\w+)")
CALLEES = {
    "item", "cpu", "tolist", "numpy", "synchronize", "to", "cuda", "randn", "rand", "randint",
    "randperm", "normal", "zeros", "ones", "full", "arange", "linspace", "eye", "tensor", "print",
}  # fmt: skip
LIBRARIES = (
    "torch/", "torchvision/", "torchaudio/", "trainadvisor/", "lightning/", "pytorch_lightning/",
    "transformers/", "accelerate/", "numpy/", "site-packages/", "dist-packages/",
)  # fmt: skip


def innermost(spans: list[tuple[float, float, str]] | None, ts: float) -> str | None:
    """The label of the latest-starting span (`spans` sorted) that contains `ts`; of spans that
    start together (a frame and the one it calls at once, at the clock's resolution), the one
    that ends first: the inner."""
    if not spans:
        return None
    i = bisect.bisect_right(spans, (ts, float("inf"), "")) - 1
    found: tuple[float, float, str] | None = None
    while i >= 0:
        start, end, label = spans[i]
        if found is not None and start < found[0]:
            break
        if start <= ts <= end:
            found = spans[i]  # sorted by end too: an earlier one of the same start ends no later
        i -= 1
    return found[2] if found is not None else None


@functools.lru_cache(maxsize=64)
def parse(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text())
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None


def call_lines(file: str, line: int, func: str, callee: str, source_dirs: tuple[Path, ...]) -> list[int]:
    """Lines in `func` of `file` that call `callee`, when the file can be found (Kineto names
    files relative to an entry of the traced process's sys.path: the script's folder, say).
    Of several functions with that name, those whose lines hold the frame's line are taken."""
    found = next((d / file for d in (*source_dirs, Path.cwd()) if (d / file).is_file()), None)
    tree = parse(found) if found is not None else None
    if tree is None:
        return []
    scopes: list[ast.AST] = [tree] if func == "<module>" else [
        node for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == func
    ]  # fmt: skip
    holding = [n for n in scopes if getattr(n, "lineno", 0) <= line <= (getattr(n, "end_lineno", 0) or 0)]
    lines = set()
    for scope in holding or scopes:
        for node in ast.walk(scope):
            if isinstance(node, ast.Call):
                target = node.func
                name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", None)
                if name == callee:
                    lines.add(node.lineno)
    return sorted(lines)


def user_site(c: Facts, tid: Any, ts: float) -> str | None:
    """Where in the user's code an event at `ts` on thread `tid` came from: the innermost user
    frame, and the line of the torch call inside it when the source can be read (Kineto names a
    frame by the line it was at when tracing began, not by the current line)."""
    frame = innermost(c.frames.get(tid), ts)
    if frame is None:
        return None
    file, line, func = frame.split("|", 2)
    callee = innermost(c.builtins.get(tid), ts)
    if callee is None:
        return f"{file} (in {func})"
    lines = call_lines(file, int(line), func, callee, c.source_dirs)
    where = f"{file}:{','.join(map(str, lines))}" if lines else file
    call = f"{callee}()" if callee in FACTORY_CALLS or callee == "print" else f".{callee}()"
    return f"{where} ({call} in {func})"


def sites(c: Facts, where: list[tuple[Any, float]]) -> list[str]:
    """Distinct user-code sites of events (thread, time), most frequent first."""
    counts: dict[str, int] = {}
    for tid, ts in where:
        site = user_site(c, tid, ts)
        if site is not None:
            counts[site] = counts.get(site, 0) + 1
    return sorted(counts, key=lambda site: -counts[site])
