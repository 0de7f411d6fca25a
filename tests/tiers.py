"""Which tests start processes (real script runs, trainadvisor's CLI in a subprocess, a child
Python, a Ray cluster, an S3 server or a browser): read from the tests' own code, so that a test
cannot be in the fast tier by mistake. A test is `e2e` where its body, a fixture it asks for, or
a function of its module or of conftest that it calls (at any depth) names one of `STARTERS`;
every other test runs in `scripts/test.sh --fast`."""

from __future__ import annotations

import ast
import functools
import inspect
from collections.abc import Iterable
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
    """Every name and attribute a piece of code mentions."""
    found: set[str] = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Name):
            found.add(child.id)
        elif isinstance(child, ast.Attribute):
            found.add(child.attr)
        elif isinstance(child, ast.arg):
            found.add(child.arg)  # a fixture asked for by name
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
