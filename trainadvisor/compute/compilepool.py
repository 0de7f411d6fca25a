"""Whether inductor's pool of compile workers is still starting, a one-time cost beside the loop.

torch.compile builds its kernels in a pool of worker processes (`compile_threads`: one per core, up
to 32) held by a sidecar process that torch starts at the first compile. Until the pool answers
its first job (`AsyncCompile._ready_future`), inductor compiles in the user's process, and the
sidecar forks and readies its workers beside the loop. On an H200 machine (16 cores, torch 2.11)
that took the sidecar 12 s of one core, after a compile of 6 s: the steps of a small compiled
model ran at 28-86 steps/s while it did (its batches' gathering, spread over every core by OpenMP,
waited for the busy one: 5 ms a batch, 0.4 ms otherwise) and at 179-224 once the pool was up,
against 205-210 eager. A trial whose warm-up settles in that period measures the start-up, not
the compiled loop: `pool_starting` tells the window's warm-up to leave such steps out of its
blocks (`training.window`), as it leaves the compile's own steps out.

Every name it reads is private to torch: each read is guarded, and a torch whose pool is not as
read here is taken for one whose pool has started, never an error in the user's training."""

from __future__ import annotations

import sys


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
