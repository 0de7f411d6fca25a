"""Whether inductor's compile pool is still starting (compute.compilepool). torch's AsyncCompile is
the boundary: a stand-in module with `AsyncCompile._ready_future`, a real Future, as torch 2.11-2.13
keep it (None until a compile asks for the pool, then the future of its first job)."""

from __future__ import annotations

import sys
import types
from concurrent.futures import Future

import pytest
from support.window import fake_async_compile

from trainadvisor.compute.compilepool import pool_starting


def test_a_pool_is_starting_from_its_first_job_until_that_job_is_done(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first: Future[str] = Future()
    fake_async_compile(monkeypatch, first)
    assert pool_starting()
    first.set_result("ready")
    assert not pool_starting()


def test_no_compile_no_pool_asked_for_or_another_torch_is_never_taken_for_a_starting_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(sys.modules, "torch._inductor.async_compile", raising=False)
    assert not pool_starting()
    fake_async_compile(monkeypatch, None)  # inductor imported, the pool never asked for (one compile thread)
    assert not pool_starting()
    monkeypatch.setitem(sys.modules, "torch._inductor.async_compile", types.SimpleNamespace())
    assert not pool_starting()  # no AsyncCompile: a torch this was not written against
