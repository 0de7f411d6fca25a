"""The tiers: a test that starts a process is found from its code (`tiers`), so `--fast` never
runs one by mistake."""

from __future__ import annotations

from pathlib import Path

from tiers import misplaced, starting_functions, tier_of


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
