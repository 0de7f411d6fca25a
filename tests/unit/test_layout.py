"""The package's shape: a newcomer finds each command's code from the tree, and imports point one
way (cli -> commands -> stages -> measure / analyze -> records), without circles."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
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


def _unit_paths() -> dict[str, Path]:
    """Each boundary, by its dotted name under trainadvisor/ (`analyze.read`), and the file that
    declares what it may import: a package's `__init__.py` (at any depth), a top-level module
    itself (`trainadvisor` for the package's own `__init__`)."""
    found = {"trainadvisor": PACKAGE / "__init__.py"}
    for init in PACKAGE.rglob("__init__.py"):
        if init.parent != PACKAGE:
            found[".".join(init.parent.relative_to(PACKAGE).parts)] = init
    for path in PACKAGE.glob("*.py"):
        if path.name != "__init__.py":
            found[path.stem] = path
    return found


def _unit(module: str, units: set[str]) -> str:
    """The boundary a module belongs to: the deepest package that holds it, or the top-level
    module itself."""
    parts = module.split(".")[1:]
    for depth in range(len(parts), 0, -1):
        name = ".".join(parts[:depth])
        if name in units:
            return name
    return "trainadvisor"


MAY_IMPORT = re.compile(r"May import: (.*?)\.\s*\Z", re.S)


def declared(docstring: str, known: set[str]) -> set[str]:
    """The boundaries a docstring's closing "May import: a (why), b, c." names ("nothing of the
    package": none); a name that is no boundary, or no such line, is an error."""
    found = MAY_IMPORT.search(docstring)
    assert found, 'its docstring must end with "May import: ...." naming the packages it imports'
    text = re.sub(r"\([^()]*\)", "", " ".join(found[1].split()))
    if text == "nothing of the package":
        return set()
    names = {name.strip() for name in text.split(",")}
    assert names <= known, f"not packages or modules of trainadvisor: {sorted(names - known)}"
    return names


def _unit_graph() -> dict[str, set[str]]:
    units = set(_unit_paths())
    graph: dict[str, set[str]] = {}
    for module, targets in _imports().items():
        graph.setdefault(_unit(module, units), set()).update(_unit(t, units) for t in targets)
    return {unit: targets - {unit} for unit, targets in graph.items()}


def test_each_package_imports_only_what_its_docstring_says_it_may() -> None:
    """A folder (at any depth: `analyze/read/` too) or top-level module is a boundary: its
    docstring's "May import" line is the rule, so it cannot say one thing while the code does
    another."""
    paths = _unit_paths()
    wrong = []
    for unit, targets in sorted(_unit_graph().items()):
        allowed = declared(ast.get_docstring(ast.parse(paths[unit].read_text())) or "", set(paths))
        # a package named covers the packages inside it (`analyze`: `analyze.read` too)
        wrong += [
            f"{unit} imports {target}"
            for target in sorted(targets)
            if not any(target == name or target.startswith(f"{name}.") for name in allowed)
        ]
    assert wrong == []


def test_the_boundaries_form_layers_no_arrow_runs_back_up() -> None:
    assert _cycles(_unit_graph()) == []


def test_the_may_import_line_is_read_as_written() -> None:
    known = {"records", "errors", "measure", "fixes"}
    assert declared("Text.\n\nMay import: records, errors (its codes),\nmeasure.", known) == {
        "records", "errors", "measure"
    }  # fmt: skip
    assert declared("Text.\n\nMay import: nothing of the package.", known) == set()
    with pytest.raises(AssertionError, match="not packages"):
        declared("May import: records, reports.", known)
    with pytest.raises(AssertionError, match="must end with"):
        declared("May import records and errors; never cli.", known)


def test_the_users_process_never_imports_trainadvisors_side_of_a_run() -> None:
    """measure/ (trainadvisor's process, torch-free) never imports training/ (the user's process,
    which imports torch): the parent of every run stays light."""
    assert "training" not in _unit_graph()["measure"]


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


# Modules that share a name across packages, each the same subject at another layer: what is
# saved (records) and how it reads (report), or a command's own entry. Any other shared name is
# a newcomer's trap (`measure/live.py` beside `memory/live.py` meant two unrelated things).
SAME_SUBJECT = {
    "command": {"analyze", "profile"},  # each command's entry
    "energy": {"records", "analyze.run"},  # saved / measured from NVML readings
    "integrations": {"", "advising"},  # the public name / the callbacks themselves
    "memory": {"records", "report"},  # saved / how it reads
    "parallel": {"training", "report"},  # seen as the script builds it / how it reads
}


def test_no_two_modules_share_a_name_unless_they_are_one_subject_at_two_layers() -> None:
    homes: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name != "__init__.py":
            package = ".".join(path.parent.relative_to(PACKAGE).parts)
            homes.setdefault(path.stem, set()).add(package)
    shared = {name: where for name, where in homes.items() if len(where) > 1}
    assert shared == SAME_SUBJECT
