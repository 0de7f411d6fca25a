"""The test tiers, one folder each: `tests/unit/` (mirrors the package; no process started, no
script run), `tests/integration/` (the CLI in-process, recorded traces, the GPU fakes) and
`tests/e2e/` (real script runs, the CLI in a subprocess, a child Python, Ray, an S3 server, a
browser). `scripts/test.sh --fast` runs the first two. Whether a test starts a process is read
from its own code, so that none sits in a fast tier by mistake: a test starts processes where its
body, a fixture it asks for, or a function of its module or of conftest that it calls (at any
depth) names one of `STARTERS`; such a test outside `tests/e2e/` is refused at collection
(`misplaced`)."""

from __future__ import annotations

import ast
import functools
import inspect
from collections.abc import Iterable, Sequence
from pathlib import Path

# Names whose use starts a process: the CLI in a subprocess, subprocess itself and sys.executable,
# a measured run (`runner.measure`, `LiveRun`), a child interpreter, multiprocessing, Ray, moto's
# server, a browser, a notebook's kernel, an MCP server.
STARTERS = frozenset({
    "run_cli", "subprocess", "Popen", "executable", "measure", "LiveRun", "_in_child",
    "multiprocessing", "ray", "ThreadedMotoServer", "sync_playwright", "fork", "forkserver",
    "NotebookClient", "stdio_client",
})  # fmt: skip


def _named(node: ast.AST) -> set[str]:
    """Every name and attribute a piece of code mentions, and the fixtures it asks for by their
    names' strings (`usefixtures("name")`, `request.getfixturevalue("name")`)."""
    found: set[str] = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Name):
            found.add(child.id)
        elif isinstance(child, ast.Attribute):
            found.add(child.attr)
        elif isinstance(child, ast.arg):
            found.add(child.arg)  # a fixture asked for by name
        elif isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute):
            if child.func.attr in ("usefixtures", "getfixturevalue"):
                found.update(a.value for a in child.args if isinstance(a, ast.Constant))
    return found


@functools.cache
def _bodies(path: Path) -> dict[str, frozenset[str]]:
    """The names each module-level function of a file mentions (conftest's are read once for
    every test module)."""
    return {
        node.name: frozenset(_named(node))
        for node in ast.parse(path.read_text()).body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    }


def starting_functions(sources: Iterable[Path]) -> set[str]:
    """The module-level functions (fixtures and helpers) of `sources` that start a process,
    directly or through one another."""
    bodies: dict[str, set[str]] = {}
    for path in sources:
        for name, names in _bodies(path).items():
            bodies[name] = bodies.get(name, set()) | names
    starting = {name for name, names in bodies.items() if names & STARTERS}
    while True:
        more = {name for name, names in bodies.items() if names & starting} - starting
        if not more:
            return starting
        starting |= more


def starts_processes(function: object, starting: set[str]) -> bool:
    """Whether a test function (its body and the fixtures it asks for) starts a process."""
    try:
        tree = ast.parse(inspect.cleandoc("\n" + inspect.getsource(function)))  # type: ignore[arg-type]
    except (OSError, TypeError, SyntaxError):
        return True  # cannot be read: not trusted to be fast
    return bool(_named(tree) & (STARTERS | starting))


TIERS = ("unit", "integration", "e2e")
FAST_TIERS = ("unit", "integration")


def tier_of(test_file: Path, tests_dir: Path) -> str | None:
    """The tier a test file's folder puts it in; None for a file outside the tiers' folders."""
    try:
        top = test_file.relative_to(tests_dir).parts[0]
    except (ValueError, IndexError):
        return None
    return top if top in TIERS else None


def misplaced(tests: Sequence[tuple[Path, object]], tests_dir: Path, conftest: Path) -> list[str]:
    """The tests (file, function) that sit outside the tiers' folders, or in a fast tier while
    their code starts a process: 'file::name: why' for each."""
    refused = []
    starting: dict[Path, set[str]] = {}
    helpers = sorted((tests_dir / "support").glob("*.py"))  # what tests of two tiers share
    for test_file, function in tests:
        tier = tier_of(test_file, tests_dir)
        shown = (
            test_file.relative_to(tests_dir.parent)
            if test_file.is_relative_to(tests_dir.parent)
            else test_file
        )
        name = f"{shown}::{getattr(function, '__name__', function)}"
        if tier is None:
            refused.append(f"{name}: outside tests/{{{','.join(TIERS)}}}/")
            continue
        if tier not in FAST_TIERS:
            continue
        if test_file not in starting:
            starting[test_file] = starting_functions([conftest, *helpers, test_file])
        if starts_processes(function, starting[test_file]):
            refused.append(f"{name}: starts a process (or asks for a fixture that does) in tests/{tier}/")
    return refused
