"""The package's shape: a newcomer finds each command's code from the tree, and imports point one
way (cli -> commands -> stages -> measure / analyze -> records), without circles."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "trainadvisor"


def _module(path: Path) -> str:
    name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return name.removesuffix(".__init__")


def _imports() -> dict[str, set[str]]:
    """Every module of the package, and the package's modules it imports (anywhere in it: a
    function's import is an arrow too)."""
    modules = {_module(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    dotted = f"{node.module}.{alias.name}"
                    found.add(dotted if dotted in modules else node.module)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for after in sorted(graph[node]):
            if after not in index:
                visit(after)
                low[node] = min(low[node], low[after])
            elif after in stack:
                low[node] = min(low[node], index[after])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_no_module_imports_one_that_imports_it_back() -> None:
    assert _cycles(_imports()) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_lower_layers_never_import_the_commands_above_them() -> None:
    """report/ renders saved records (no running anything), analyze/ and measure/ are the
    stages' tools: none of them imports a command's package or the command line."""
    above = ("trainadvisor.profile", "trainadvisor.advising", "trainadvisor.cli")
    forbidden = {
        "trainadvisor.report": (*above, "trainadvisor.measure"),
        "trainadvisor.analyze": above,
        "trainadvisor.measure": (*above, "trainadvisor.report", "trainadvisor.analyze"),
        "trainadvisor.records": ("trainadvisor.",),  # records import only their own modules
    }
    wrong = [
        f"{module} imports {target}"
        for module, targets in _imports().items()
        for layer, banned in forbidden.items()
        if module == layer or module.startswith(f"{layer}.")
        for target in targets
        if target.startswith(banned) and not target.startswith(f"{layer}.")
    ]
    assert wrong == []


def test_the_top_holds_few_modules_and_every_package_says_what_it_is() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 12, top
    for package in (p.parent for p in PACKAGE.rglob("__init__.py")):
        docstring = ast.get_docstring(ast.parse((package / "__init__.py").read_text()))
        assert docstring, f"{package.relative_to(ROOT)}/__init__.py says nothing of what it is"


def test_the_public_names_stay_what_users_import_whatever_subpackage_is_loaded() -> None:
    """A subpackage named like a public function would shadow it once imported."""
    import importlib

    for module in (
        "trainadvisor.advising.advisor",
        "trainadvisor.profile.command",
        "trainadvisor.analyze.command",
    ):
        importlib.import_module(module)
    from trainadvisor import advise, step
    from trainadvisor.integrations import HuggingFaceAdvisor, LightningAdvisor

    assert callable(advise) and advise.__module__ == "trainadvisor.advising.advisor"
    assert callable(step) and callable(HuggingFaceAdvisor) and callable(LightningAdvisor)


def test_the_measured_run_imports_what_it_measures_with_and_not_what_writes_reports() -> None:
    """The script's process (`training.child`, its hooks and the fixes' switches) starts in every
    run and trial: it must not pay for the libraries that write code changes and reports."""
    import subprocess
    import sys

    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, trainadvisor.training.child, trainadvisor.training.hooks; "
         "print(' '.join(sorted(m for m in ('libcst', 'jinja2', 'click') if m in sys.modules)))"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert loaded == []
