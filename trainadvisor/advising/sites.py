"""Where the user built a DataLoader that `@advise` first meets as an iterator (the loaders were
built before the decorator could see them, so no constructor call was watched): the loader is
found by name in the frames that iterate it (a local, an attribute of `self`, a global), and its
line is the assignment of that name to a `DataLoader(...)` call (or any call whose name ends in
`DataLoader` or `loader`) in that frame's source file. Nothing here runs user code: frames are
read, files parsed."""

from __future__ import annotations

import ast
import inspect
import linecache
from types import FrameType
from typing import Any

from trainadvisor.frameworks import ours_or_torch
from trainadvisor.records import LoaderInfo
from trainadvisor.training.loaders import describe_iterator

# How many of the user's frames, from the one iterating, are searched for the loader.
FRAMES = 8


def loader_of(iterator: Any, known: list[LoaderInfo]) -> LoaderInfo:
    """The loader a new iterator serves: one of `known` (the same dataset, built at the same
    line: its next epoch), or a new one, described, whose index is `len(known)`."""
    info = describe_iterator(iterator, len(known))
    info.created_at = built_at(iterator) or info.created_at
    same = (i for i in known if (i.dataset_id, i.created_at) == (info.dataset_id, info.created_at))
    return next(same, info)


def built_at(iterator: Any) -> str | None:
    """`file:line` of the assignment that built the loader `iterator` serves, or None."""
    dataset = getattr(iterator, "_dataset", None)
    frame: FrameType | None = inspect.currentframe()
    searched = 0
    while frame is not None and searched < FRAMES:
        name = frame.f_code.co_filename
        if not ours_or_torch(name):
            searched += 1
            for held in _names_of_loader(frame, dataset):
                line = _assignment_line(name, held, frame.f_code.co_firstlineno)
                if line is not None:
                    return f"{name}:{line}"
        frame = frame.f_back
    return None


def _names_of_loader(frame: FrameType, dataset: Any) -> list[str]:
    """The names (a variable, or `self.<attribute>`) under which the frame holds a DataLoader of
    `dataset`."""
    from torch.utils.data import DataLoader

    owner = getattr(frame.f_locals.get("self"), "__dict__", {})
    return [
        prefix + name
        for prefix, scope in (("", frame.f_locals), ("", frame.f_globals), ("self.", owner))
        for name, value in list(scope.items())
        if isinstance(value, DataLoader) and value.dataset is dataset
    ]


def _assignment_line(path: str, name: str, near_line: int) -> int | None:
    """The line of `name = <...loader call>` (or `self.name = ...`) in the file: the first at or
    after `near_line` (the frame's function), else the first in the file."""
    source = "".join(linecache.getlines(path))
    if not source:
        return None
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    built = [
        (node.lineno, _targets(node))
        for node in ast.walk(tree)
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and _builds_loader(node.value)
    ]
    lines = sorted(line for line, targets in built if name in targets)
    if not lines and "." in name:  # an attribute set under another name than `self` (`trainer.x = ...`)
        lines = sorted(line for line, targets in built if "." + name.split(".")[-1] in targets)
    after = [line for line in lines if line >= near_line]
    chosen = after or lines
    return chosen[0] if chosen else None


def _targets(node: ast.Assign | ast.AnnAssign) -> set[str]:
    """The names an assignment sets: `x`; `self.x` as "self.x" and, for an attribute of any
    other object, ".x" (a bare `x` is another variable than `self.x`)."""
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    names = set()
    for target in targets:
        for part in ast.walk(target):
            if isinstance(part, ast.Name) and isinstance(part.ctx, ast.Store):
                names.add(part.id)
            elif isinstance(part, ast.Attribute):
                names.add("." + part.attr)
                if isinstance(part.value, ast.Name) and part.value.id == "self":
                    names.add("self." + part.attr)
    return names


def _builds_loader(value: ast.expr | None) -> bool:
    if not isinstance(value, ast.Call):
        return False
    func = value.func
    called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return called.endswith("DataLoader") or called.lower().endswith("loader")
