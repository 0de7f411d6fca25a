"""`@advise` where processes start: under `trainadvisor profile` (which it stands down for), and
its trials, whose stand-in DataLoaders start worker processes in the test's own."""

from __future__ import annotations

import json
from pathlib import Path

import psutil
from conftest import run_cli
from support.advise import EXACT, _model, _Slow, _state
from torch import nn
from torch.utils.data import DataLoader

from trainadvisor import advise


def test_advise_stands_down_under_trainadvisor_profile(tmp_path: Path) -> None:
    """A script with @advise profiled by `trainadvisor profile`: one profiler, one report."""
    script = tmp_path / "advised.py"
    script.write_text(
        "import torch\n"
        "from trainadvisor import advise\n"
        "model = torch.nn.Linear(4, 1)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "@advise(warmup=1, steps=2, out='inner')\n"
        "def step():\n"
        "    loss = model(torch.randn(8, 4)).pow(2).mean()\n"
        "    optimizer.zero_grad(); loss.backward(); optimizer.step()\n"
        "    return loss\n"
        "for _ in range(40):\n"
        "    step()\n"
    )
    # windows of exactly --warmup and --steps steps: a window waiting for the loop to settle would
    # outlast the script's 40 steps, and the profile would run it again to fit
    result = run_cli(
        "profile", "--no-fix", "--warmup", "2", "--steps", "5", "--max-warmup", "0", "--min-time", "0",
        "--out", tmp_path / "r", script, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "r" / "report.json").is_file() and not (tmp_path / "inner").exists()


THREADED = """
import sys, threading
import torch
from trainadvisor import advise

@advise(warmup=2, steps=5, min_time=0, max_warmup=None, out=sys.argv[1])
def step(model, optimizer, x, rank):
    loss = model(x).pow(2).mean() * 0 + float(rank)  # each thread's loss is its own number
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss

def train(rank):
    model = torch.nn.Linear(16, 16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(300):
        step(model, optimizer, torch.randn(8, 16), rank)

threads = [threading.Thread(target=train, args=(rank,)) for rank in range(8)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print("trained")
"""


def test_a_step_called_from_eight_threads_is_measured_on_one_and_the_others_pass_through(
    tmp_path: Path,
) -> None:
    """Eight threads, each its own model, call one decorated step: the profiler started in one
    thread and stopped in another aborted the process in about half the runs (Kineto: "External
    init callback must run in same thread as registerClient"). The window is the first thread's
    alone: every loss it recorded is that thread's own number; the process trains to its end."""
    import subprocess
    import sys

    script = tmp_path / "threaded.py"
    script.write_text(THREADED)
    for run in range(2):  # a crash came in about half the runs
        out = tmp_path / f"r{run}"
        done = subprocess.run(
            [sys.executable, str(script), str(out)], capture_output=True, text=True, timeout=300, cwd=tmp_path
        )
        assert done.returncode == 0 and "trained" in done.stdout, done.stderr[-3000:]
        assert "was called from another thread too: only the first thread's steps are measured" in done.stderr
        steps = json.loads((out / "report.json").read_text())["baseline"]["raw"]["steps"]
        assert len({step["loss"] for step in steps}) == 1 and len(steps) >= 5


def test_trials_measure_the_workers_fix_in_this_process_and_put_everything_back(tmp_path: Path) -> None:
    """advise(trials=True) on a loop whose DataLoader reads slowly: the workers fix is measured
    in windows of this process (no restart), its worker processes are gone afterwards, and the
    loop's own iterator goes on where it stopped."""
    model, optimizer = _model()
    loader = DataLoader(_Slow(), batch_size=4)  # 8 samples x 2 ms: 2 batches an epoch
    seen = []
    before = _state()
    with advise(warmup=2, steps=6, out=tmp_path / "r", trials=True, **EXACT) as advisor:
        for _ in range(120):
            for x, y in loader:
                seen.append(int(x.shape[0]))
                loss = nn.functional.cross_entropy(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                advisor.step(loss)
    assert not advisor.active and advisor.trials is None and _state() == before
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    [workers] = [o for o in report["fix_outcomes"] if o["fix"] == "dataloader-workers"]
    assert workers["mode"] == "in_process" and workers["trials"], workers
    # the first count is 2, or more where the baseline's loading was seen waiting (its sleeps)
    assert workers["trials"][0]["label"] in ("num_workers=2", "num_workers=4", "num_workers=8")
    assert workers["trials"][0]["status"] == "measured"
    assert workers["status"] in ("unconfirmed", "no_gain")
    labels = [w["label"] for w in report["trial_windows"]]
    assert labels[0] == "baseline" and labels[-1] == "baseline-again"
    assert not [p for p in psutil.Process().children(recursive=True) if p.is_running()]  # workers gone
    assert set(seen) == {4}
    # what the trials did to the training, exactly: the loop saw its 120 epochs of 2 batches, and
    # as many more batches from the stand-ins as the note says
    extra = len(seen) - 240
    [note] = [n for n in report["notes"] if n.startswith("The trial windows trained ")]
    assert extra > 0 and note.startswith(f"The trial windows trained {extra} extra steps of your run"), note
