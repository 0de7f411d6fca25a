"""Shared helpers: the tests run the real `trainadvisor` CLI in a subprocess, on real scripts."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

# The suite is the same on every machine: a real GPU is hidden from it (and from every process it
# starts), so the examples and scripts it runs train on the CPU, as CI's do. GPU behaviour is
# tested through the fakes (tests/fakes) and on the recorded GPU traces and reports in ../shared;
# on a GPU, scripts/gpu_check.py is the acceptance run.
os.environ["CUDA_VISIBLE_DEVICES"] = ""
# One torch thread per process: the suite runs a test per core and one more (scripts/test.sh), and
# each test's runs would otherwise start a thread per core too, every core oversubscribed and every
# timing the noisier for it.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The best CPU peak measured on this machine is kept between runs (`compute.peaks.best_cpu_peak`):
# the suite keeps its own, not the user's cache.
os.environ.setdefault(
    "TRAINADVISOR_CPU_PEAKS", os.path.join(tempfile.mkdtemp(prefix="ta-peaks-"), "cpu.json")
)
# Every measurement a test's run makes, in this process and the ones it starts, must be declared
# in the catalogue (trainadvisor/records/measurements.py): `rulebook.diagnose` fails otherwise.
os.environ["TRAINADVISOR_CHECK_MEASUREMENTS"] = "1"
# Every report.json a test writes, in this process and the ones it starts, must hold to the
# shipped schema (trainadvisor/records/report.schema.json): `report.render.write_report` fails
# otherwise.
os.environ["TRAINADVISOR_CHECK_REPORTS"] = "1"

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
SCRIPTS = ROOT / "tests" / "scripts"
DATA = ROOT / "tests" / "data"
FAKES = ROOT / "tests" / "fakes"  # the GPU boundary's stand-ins (tests/fakes/README.md)
# Timed windows of half a second instead of the default second: for the tests that check what a
# run records and decides, on gains that dwarf the noise (tests/e2e/test_gpu_speed.py times windows).
SHORT = ("--min-time", "0.5s")
# A warm-up that waits at most 3 s for step time to settle instead of a minute: for the tests that
# check what a run decides on gains that dwarf any drift, where a test beside them (pytest -n) can
# keep a loop and its DataLoader workers from settling for long (an unsettled window is only noted).
SETTLE_CAP = ("--max-warmup", "3s")
# The worker search stops at 8 workers (four per core here) instead of doubling on to 16-64 where
# an example's input waits on its sleeps: what is tested is the fix's path and decision, on gains
# that 8 workers already make large, not how far latency-bound loading scales.
WORKER_CAP = ("--max-workers", "8")

# The fastest a training step of the tests' scripts can be on any machine (a GPU's included): a
# Python loop with an optimizer step pays tens of microseconds of host work whatever the device.
FASTEST_STEP_S = 20e-6


def epochs_outlasting(size: Any, steps_per_epoch: int, fastest_step_s: float = FASTEST_STEP_S) -> int:
    """Epochs of `steps_per_epoch` steps that outlast a window of this `WindowSize` at any speed:
    its warm-up's time cap, its timed steps' floor three times over (they may slide twice), and a
    second for the window's own steps. A run stops after its window, so the epochs left cost
    nothing; a test whose script must outlast its windows chooses its length from them, not from
    the speed of the machine it was written on (issue 42)."""
    settle_s = size.settle.max_s if size.settle is not None else 0.0
    longest_s = settle_s + 3 * size.min_time_s + 1.0
    return max(1, math.ceil(longest_s / fastest_step_s / steps_per_epoch))


@contextlib.contextmanager
def silent_server() -> Iterator[int]:
    """A port on 127.0.0.1 where a server accepts every connection and never says a word (an
    endpoint that hangs): its port, for as long as the block runs."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:  # closed: the block has ended
                return

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield server.getsockname()[1]
    finally:
        server.close()
        for connection in held:
            connection.close()


@contextlib.contextmanager
def trickling_server(every_s: float = 0.5) -> Iterator[int]:
    """A port on 127.0.0.1 where a server answers every request with an HTTP response sent one
    byte every `every_s` (a store that trickles: no socket read ever waits long enough to time
    out): its port, for as long as the block runs."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    done = threading.Event()
    response = b"HTTP/1.1 200 OK\r\nContent-Type: application/xml\r\nContent-Length: 100000\r\n\r\n"

    def trickle(connection: socket.socket) -> None:
        with connection:
            try:
                connection.recv(65536)
                for byte in response + b" " * 100000:
                    if done.wait(every_s):
                        return
                    connection.sendall(bytes([byte]))
            except OSError:  # the client gave up
                return

    def accept() -> None:
        while True:
            try:
                connection = server.accept()[0]
            except OSError:  # closed: the block has ended
                return
            threading.Thread(target=trickle, args=(connection,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield server.getsockname()[1]
    finally:
        done.set()
        server.close()


# Traces recorded by others live beside the checkout, not in it (see ../shared/README.md).
SHARED_TRACES = ROOT.parent / "shared" / "traces"


# The first runs of trainadvisor on an H100: reports, traces and raw GPU artifacts.
GPU_RUNS = ROOT.parent / "shared" / "gpu-runs" / "h100-2026-11-24"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "long_run: an end-to-end test of half a minute or more (profile runs with their fixes' trials), "
        "started before the others",
    )
    config.addinivalue_line(
        "markers",
        "e2e: starts processes (script runs, the CLI in a subprocess, Ray, an S3 server, a browser); "
        "set on every test in tests/e2e/, never by hand; `scripts/test.sh --fast` leaves them out",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    from tiers import misplaced, tier_of

    tests_dir = Path(__file__).parent
    refused = misplaced(
        [(Path(str(item.fspath)), getattr(item, "function", item.name)) for item in items],
        tests_dir,
        Path(__file__),
    )
    if refused:
        raise pytest.UsageError(
            "tests in the wrong tier (tests/tiers.py): move each to tests/e2e/, or give it what it "
            "needs without starting a process:\n  " + "\n  ".join(refused)
        )
    for item in items:
        if tier_of(Path(str(item.fspath)), tests_dir) == "e2e":
            item.add_marker(pytest.mark.e2e)
    # pytest -n (--dist loadgroup) hands tests out in the order collected, groups first: with the
    # longest started first, the short ones even out the workers' ends (a long test collected last
    # kept one worker busy for a minute and more after the other had finished)
    items.sort(key=lambda item: item.get_closest_marker("long_run") is None)


def _shared(path: Path, what: str) -> Path:
    if not path.exists():
        pytest.skip(
            f"{path} is not on this machine: {what} beside the checkout (present on development "
            "machines and in CI)"
        )
    return path


def shared_trace(relative: str) -> Path:
    """A trace under ../shared/traces; the test is skipped, saying why, where it is absent."""
    return _shared(
        SHARED_TRACES / relative, "the real GPU traces recorded by others are read from ../shared/traces"
    )


def gpu_run(relative: str) -> Path:
    """A file or folder of the first H100 runs (../shared/gpu-runs); skipped where absent."""
    what = "the H100 runs' reports and traces are read from ../shared/gpu-runs"
    return _shared(GPU_RUNS / relative, what)


def published(path: str | Path, cwd: Path) -> str:
    """A path as a published report shows it when trainadvisor ran in `cwd`: relative to the
    repository around `cwd` (its .git), else to `cwd` itself (`report.paths`)."""
    from trainadvisor.report.paths import relative_text, repository_root

    return relative_text(str(path), repository_root(cwd))


def run_cli(
    *args: str | Path, cwd: Path, timeout_s: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainadvisor", *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def load_report(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "report.json").read_text())


def kept_or_loaded(report: dict[str, Any], fix: str) -> tuple[bool, tuple[str, str, list[str]]]:
    """Whether `fix` was kept, or ended inconclusive with no change given where the report names
    other processes' CPU beside its windows or the machine's speed changing between its runs
    (issue 36's answer on a loaded machine: CI's other tests and a busy core beside a run once
    left a short script's 3-4x gain at "inconclusive"); with what the assertion shows."""
    [outcome] = [o for o in report["fix_outcomes"] if o["fix"] == fix]
    reason = outcome["reason"] or ""
    loaded = any(note.startswith("Other processes used") for note in report["notes"]) or (
        "other processes used" in reason or "the machine's speed changed between runs" in reason
    )
    open_ = loaded and outcome["status"] == "inconclusive" and not outcome["diff"]
    held = outcome["status"] == "kept" or open_
    return held, (outcome["status"], reason, report["notes"])


def processes_running(fragment: str | Path, within: str | Path) -> list[str]:
    """Command lines of live processes that mention `fragment` (leftover scripts or workers) and
    the test's folder `within`: the report folder (or the run's config file in it) is on every
    command line of a run, so tests running side by side (pytest -n) do not see each other's."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
        except psutil.Error:
            continue
        mine = str(fragment) in cmdline and str(within) in cmdline
        if mine and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(cmdline)
    return found


def _shared_profile(
    factory: pytest.TempPathFactory, name: str, *args: str | Path
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """A `profile` run shared by the tests that read it: each test marks itself
    `@pytest.mark.xdist_group(<the fixture's name>)`, so that under pytest -n one worker runs it once."""
    work = factory.mktemp(name)
    out = work / "report"
    command = ("profile", "--warmup", "3", "--steps", "10", *SHORT, *WORKER_CAP, "--out", out, *args)
    return run_cli(*command, cwd=work), out


def require(package: str, reason: str) -> None:
    """Skip the calling test module where `package` is not installed, without importing it: each
    pytest worker collects every module, and most never run the tests that need the package
    (MLflow, W&B and the MCP SDK took 2 s of each worker's collection to import)."""
    if importlib.util.find_spec(package) is None:
        pytest.skip(reason, allow_module_level=True)


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """This process's NVML is the stand-in (tests/fakes/nvml)."""
    monkeypatch.syspath_prepend(str(FAKES / "nvml"))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    return monkeypatch


@pytest.fixture
def one_process_group() -> Iterator[None]:
    """A gloo process group of this one process (DDP and FSDP2 built in a test)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="session")
def slow_input_report(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """One full `profile` run of the slow-input example, shared by the tests that read it."""
    # --samples: long enough for every window, traces included (runs stop after their window, so
    # the length is spent only where a window needs it); 100,000 samples (1,563 steps) once fell
    # short in CI, where the confirmation run's warm-up on a loaded machine took 1,475 steps and
    # the script ended before the traced ones
    samples = ("--samples", "400000")
    return _shared_profile(tmp_path_factory, "slow", EXAMPLES / "slow_input_mnist.py", *samples)


@pytest.fixture(scope="session")
def loader_variants_report(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """One full `profile` run of tests/scripts/loader_variants.py (DataLoaders built anew every
    epoch, so the workers' trials restart the script), shared by the tests that read it."""
    # a loader rebuilt every 12 steps never settles (its workers start anew each epoch): what is
    # tested is where the fix goes and how its trials run, on a gain of 3x at 4 workers, not how
    # long a trial waits to settle or how far the workers scale
    capped = ("--max-warmup", "1s", "--max-workers", "4")
    return _shared_profile(tmp_path_factory, "variants", *capped, SCRIPTS / "loader_variants.py")


@pytest.fixture(scope="session")
def iterable_unsharded_report(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """One full `profile` run of tests/scripts/iterable_unsharded.py (an IterableDataset whose
    workers repeat each other's samples), shared by the tests that read it."""
    return _shared_profile(tmp_path_factory, "iterable", SCRIPTS / "iterable_unsharded.py")


def lightning_module(lightning: Any, log_loss: bool = False) -> Any:
    """A linear classifier on 16 features as a LightningModule trained with SGD, logging its
    loss as `train_loss` where asked."""
    import torch
    from torch import nn

    class Module(lightning.LightningModule):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(16, 4)

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = nn.functional.cross_entropy(self.net(x), y)
            if log_loss:
                self.log("train_loss", loss)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Module()
