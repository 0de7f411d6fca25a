"""The tiers: a test that starts a process is found from its code (`tiers`), so `--fast` never
runs one by mistake."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT
from tiers import misplaced, starting_functions, starts_processes, tier_of


def test_a_helper_that_runs_the_cli_makes_every_helper_calling_it_start_processes(tmp_path: Path) -> None:
    module = tmp_path / "test_example.py"
    module.write_text(
        "def _run(x):\n    return run_cli('profile', x)\n\n"
        "def _twice(x):\n    return [_run(x), _run(x)]\n\n"
        "def _child():\n    return subprocess.run([sys.executable, '-c', 'pass'])\n\n"
        "def pure(x):\n    return x + 1\n"
    )
    assert starting_functions([module]) == {"_run", "_twice", "_child"}


def test_a_fast_tier_refuses_a_test_that_starts_a_process(tmp_path: Path) -> None:
    tests_dir = tmp_path / "tests"
    conftest = tests_dir / "conftest.py"
    conftest.parent.mkdir()
    conftest.write_text("def slow_report():\n    return run_cli('profile', 'train.py')\n")
    module = tests_dir / "unit" / "test_example.py"
    module.parent.mkdir()
    module.write_text(
        "def test_pure():\n    assert 1 + 1 == 2\n\ndef test_asks(slow_report):\n    assert slow_report\n"
    )
    namespace: dict[str, object] = {}
    exec(compile(module.read_text(), str(module), "exec"), namespace)
    tests = [(module, namespace["test_pure"]), (module, namespace["test_asks"])]
    assert misplaced(tests, tests_dir, conftest) == [
        "tests/unit/test_example.py::test_asks: starts a process (or asks for a fixture that does) "
        "in tests/unit/"
    ]
    e2e = tests_dir / "e2e" / "test_example.py"
    loose = tests_dir / "test_example.py"
    assert misplaced(
        [(e2e, namespace["test_asks"]), (loose, namespace["test_pure"])], tests_dir, conftest
    ) == ["tests/test_example.py::test_pure: outside tests/{unit,integration,e2e}/"]
    assert [tier_of(p, tests_dir) for p in (module, e2e, loose)] == ["unit", "e2e", None]


def _package_modules() -> set[str]:
    package = ROOT / "trainadvisor"
    return {
        ".".join(p.relative_to(package).with_suffix("").parts).removesuffix("__init__").rstrip(".")
        for p in package.rglob("*.py")
    } - {""}


def _imported_by_fast_tiers() -> set[str]:
    """Every trainadvisor module a unit or integration test (or a helper of theirs) imports, and
    the packages above it (importing a module runs them)."""
    found: set[str] = set()
    folders = [ROOT / "tests" / tier for tier in ("unit", "integration", "support")]
    for path in (p for folder in folders for p in folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            for name in names:
                parts = name.split(".")
                if parts[0] == "trainadvisor":
                    found.update(".".join(parts[1:i]) for i in range(2, len(parts) + 1))
    return found


def test_every_module_is_imported_by_a_unit_or_integration_test() -> None:
    """A new module is tested where it is written: by a test of tests/unit or tests/integration
    that imports it (the e2e tests' real runs reach it too, but slowly and without exact values)."""
    untested = _package_modules() - _imported_by_fast_tiers()
    assert sorted(untested) == [], "import these in a test of tests/unit or tests/integration"


def _functions(module: Path, source: str) -> dict[str, object]:
    """The functions of `source`, written to `module` so that their code can be read back."""
    module.parent.mkdir(parents=True, exist_ok=True)
    module.write_text(source)
    namespace: dict[str, object] = {}
    exec(compile(source, str(module), "exec"), namespace)
    return namespace


def test_a_test_starts_processes_by_what_it_calls_or_the_fixtures_it_asks_for(tmp_path: Path) -> None:
    found = _functions(
        tmp_path / "test_example.py",
        "import subprocess\n\n"
        "def asks_for(slow_input_report):\n    assert slow_input_report\n\n"
        "def by_name(request):\n    request.getfixturevalue('slow_input_report')\n\n"
        "def spawns():\n    subprocess.run(['true'], check=True)\n\n"
        "def pure():\n    assert sum([1, 2]) == 3\n",
    )
    assert starts_processes(found["asks_for"], {"slow_input_report"})
    assert starts_processes(found["by_name"], {"slow_input_report"})
    assert starts_processes(found["spawns"], set())
    assert not starts_processes(found["pure"], {"slow_input_report"})


def test_a_helper_in_tests_support_that_starts_a_process_is_seen(tmp_path: Path) -> None:
    tests_dir = tmp_path / "tests"
    conftest = tests_dir / "conftest.py"
    _functions(conftest, "")
    _functions(tests_dir / "support" / "runs.py", "def profiled(x):\n    return run_cli('profile', x)\n")
    module = tests_dir / "integration" / "test_example.py"
    found = _functions(module, "def test_reads(tmp_path):\n    assert profiled(tmp_path)\n")
    assert misplaced([(module, found["test_reads"])], tests_dir, conftest) == [
        "tests/integration/test_example.py::test_reads: starts a process (or asks for a fixture that "
        "does) in tests/integration/"
    ]
