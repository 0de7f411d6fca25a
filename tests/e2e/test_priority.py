"""`measure.priority.restore` on a real process whose thread was started while it stood lowered,
as torch's intra-op pool is when a script's set-up runs while its run stands by (`training.gate`):
raising the calling thread alone leaves that thread at 19, starved beside a busy core."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from trainadvisor.measure import priority

CHILD = textwrap.dedent(
    """
    import json, os, threading
    from trainadvisor.measure import priority

    started, done = threading.Event(), threading.Event()
    def pool_thread():
        started.set()
        done.wait()

    def nices():
        return sorted(os.getpriority(os.PRIO_PROCESS, tid) for tid in priority.threads())

    before = priority.lower()
    thread = threading.Thread(target=pool_thread)
    thread.start()
    started.wait()
    lowered = nices()
    os.setpriority(os.PRIO_PROCESS, 0, before)  # the calling thread alone, as the gate once did
    main_only = nices()
    left = priority.restore(before)
    print(json.dumps({"before": before, "lowered": lowered, "main_only": main_only, "left": left,
                      "restored": nices()}))
    done.set()
    """
)


@pytest.mark.skipif(not priority.restorable(), reason="this user may not raise a lowered priority back")
def test_restore_raises_every_thread_back_in_a_real_process() -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, check=True, timeout=60
    )
    seen = json.loads(out.stdout)
    before = seen["before"]
    assert seen["lowered"] == [19, 19]
    assert seen["main_only"] == [before, 19]  # the thread started while lowered stays there
    assert seen["left"] == 0
    assert seen["restored"] == [before, before]
