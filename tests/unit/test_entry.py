"""The package's entry points: `trainadvisor._version.__version__` is the version pyproject.toml
builds with (hatch reads it from that file) and the one `--version` prints; `python -m
trainadvisor` (importing trainadvisor.__main__) runs the command line on sys.argv, in-process."""

from __future__ import annotations

import importlib
import re
import sys

import pytest
import tomllib
from click.testing import CliRunner
from conftest import ROOT

from trainadvisor._version import __version__
from trainadvisor.cli import main

# hatch's own pattern for a version in a file (hatchling.version.source.regex)
HATCH_PATTERN = r"""(?i)^(__version__|VERSION) *= *([\'"])v?(?P<version>.+?)\2"""


def test_the_version_is_the_one_pyproject_toml_builds_with() -> None:
    """pyproject.toml's version is dynamic: hatch reads it from trainadvisor/_version.py."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" in pyproject["project"]["dynamic"] and "version" not in pyproject["project"]
    source = ROOT / pyproject["tool"]["hatch"]["version"]["path"]
    assert source == ROOT / "trainadvisor" / "_version.py"
    found = re.search(HATCH_PATTERN, source.read_text(), flags=re.MULTILINE)
    assert found is not None and found["version"] == __version__
    assert re.fullmatch(r"\d+\.\d+\.\d+", __version__)


def test_version_prints_the_packages_version() -> None:
    result = CliRunner().invoke(main, ["--version"])
    assert (result.exit_code, result.output) == (0, f"trainadvisor, version {__version__}\n")


def _argv(monkeypatch: pytest.MonkeyPatch, *args: str) -> None:
    monkeypatch.setattr(sys, "argv", ["trainadvisor", *args])
    # each import runs the module anew (a module whose import raised is not kept, but be sure)
    monkeypatch.delitem(sys.modules, "trainadvisor.__main__", raising=False)


def test_importing_trainadvisor_main_runs_the_command_line_on_sys_argv(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _argv(monkeypatch, "--version")
    with pytest.raises(SystemExit) as exited:
        importlib.import_module("trainadvisor.__main__")
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"trainadvisor, version {__version__}\n"
    assert "trainadvisor.__main__" not in sys.modules


def test_python_m_trainadvisor_refuses_an_unknown_option_with_exit_code_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _argv(monkeypatch, "--no-such-option")
    try:
        with pytest.raises(SystemExit) as exited:
            import trainadvisor.__main__  # noqa: F401
    finally:
        sys.modules.pop("trainadvisor.__main__", None)
    assert exited.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.splitlines()[-1] == "Error: No such option '--no-such-option'."
