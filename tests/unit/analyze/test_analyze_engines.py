"""`analyze --engine ray` (issue 27, part 2): the same report as the local engine, a cluster
joined by --address or RAY_ADDRESS, and the local engine's messages for what goes wrong. One
local Ray for the module, started by the engine itself; the CLI's runs join it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import ROOT

from trainadvisor.analyze.engines import LocalEngine, RayEngine, engine_for
from trainadvisor.errors import MissingDependencyError, UsageError

sys.path.insert(0, str(ROOT / "benchmarks"))


pytestmark = pytest.mark.xdist_group("ray")  # one local Ray for the module, on one worker


def test_without_ray_installed_the_message_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(MissingDependencyError, match=r"pip install 'trainadvisor\[ray\]'"):
        RayEngine().run([Path("rank0.json")])


def test_an_address_needs_the_ray_engine() -> None:
    with pytest.raises(UsageError, match="add --engine ray"):
        engine_for("local", "10.0.0.1:6379")
    assert isinstance(engine_for("local"), LocalEngine)
    assert engine_for("ray", "10.0.0.1:6379") == RayEngine("10.0.0.1:6379")
