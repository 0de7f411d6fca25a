"""Whether inductor's pool of compile workers is still starting, a one-time cost beside the loop.

torch.compile builds its kernels in a pool of worker processes (`compile_threads`: one per core, up
to 32) held by a sidecar process that torch starts at the first compile. Until the pool answers
its first job (`AsyncCompile._ready_future`, read in torch 2.13's source: the sidecar runs that job
once it has started its workers), inductor compiles in the user's process, and the sidecar forks
and readies its workers beside the loop. On an H200 machine (16 cores, torch 2.11; the runs in
tests/data/own/h200-2026-11-30) the sidecar kept one core busy for 12 s and more after a compile of
6-10 s (in one run, until the run ended), and the steps of a small compiled model ran at 28-86
steps/s while it did (its batches' gathering, spread over every core by OpenMP, waited for the
busy one: 5 ms a batch, 0.4 ms otherwise), at 179-207 once the pool was up (224 once it was shut
down), against 205-210 eager. A trial whose warm-up settles in that period measures the start-up,
not the compiled loop: `PoolWait` leaves such steps out of a window's warm-up blocks
(`training.window`), as the compile's own steps are, and `fixes.compile` counts what they cost in
its break-even. A pool that torch quiesced after a minute idle and wakes for a recompile restarts
its workers with `_ready_future` long done: that restart is not left out (not measured on a GPU).

Every name it reads is private to torch: each read is guarded, and a torch whose pool is not as
read here is taken for one whose pool has started, never an error in the user's training."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any


def pool_starting() -> bool:
    """Whether this process's inductor compile pool was asked to start and is not ready yet."""
    module = sys.modules.get("torch._inductor.async_compile")
    if module is None:  # nothing compiled with inductor in this process
        return False
    try:
        ready = getattr(module.AsyncCompile, "_ready_future", None)
        return ready is not None and not ready.done()
    except Exception:  # torch's internals changed: take the pool for started
        return False


@dataclass
class PoolWait:
    """The warm-up steps a window leaves out of its blocks while torch's compile pool starts."""

    wait_s: float = 0.0
    steps: int = 0
    starting_at_open: bool = False  # its timed steps began with the pool still starting (a cap)

    def leaves_out(self, step_s: float, waited_s: float, max_s: float) -> bool:
        """Whether a warm-up step of `step_s` is left out: the pool is starting, and the warm-up's
        time cap (`max_s`, of which `waited_s` has passed since the counted steps) has not run out."""
        if waited_s >= max_s or not pool_starting():
            return False
        self.wait_s += step_s
        self.steps += 1
        return True

    def opened(self) -> None:
        """The timed steps begin (at a cap of the warm-up, the pool may still be starting)."""
        self.starting_at_open = self.steps > 0 and pool_starting()

    def facts(self) -> dict[str, Any]:
        """What was left out, for the window's compile facts ({} where nothing was)."""
        if not self.steps:
            return {}
        facts: dict[str, Any] = {"pool_start_wait_s": round(self.wait_s, 3), "pool_start_steps": self.steps}
        return facts | ({"pool_starting_when_timed": True} if self.starting_at_open else {})
