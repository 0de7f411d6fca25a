"""The code changes written into reports: real scripts of this repository, edited with libcst."""

from __future__ import annotations

from pathlib import Path

from conftest import EXAMPLES

from trainadvisor.frameworks.change import fix_change
from trainadvisor.records import Overrides

MNIST = (EXAMPLES / "slow_input_mnist.py").resolve()
COMPUTE = (EXAMPLES / "compute_bound.py").resolve()


def _diff(script: Path, fix: str, settings: dict) -> str | None:  # type: ignore[type-arg]
    return fix_change(script, fix, Overrides(**settings), None).diff or None


def test_dataloader_settings_and_non_blocking_batch_copies() -> None:
    settings = {"loaders": {f"{MNIST}:56": {"num_workers": 8, "pin_memory": True}}, "non_blocking_h2d": True}
    assert _diff(MNIST, "dataloader-workers", settings) == (
        "--- a/slow_input_mnist.py\n"
        "+++ b/slow_input_mnist.py\n"
        "@@ -57,7 +57,8 @@\n"
        "         SlowMNIST(args.samples, args.latency_ms),\n"
        "         batch_size=args.batch_size,\n"
        "         shuffle=True,\n"
        "-        num_workers=args.num_workers,\n"
        "+        num_workers=8,\n"
        "+        pin_memory=True,\n"
        "     )\n"
        "     model = nn.Sequential(\n"
        "         nn.Flatten(),\n"
        "@@ -72,7 +73,7 @@\n"
        "     for epoch in range(args.epochs):\n"
        "         started = time.perf_counter()\n"
        "         for step, (images, labels) in enumerate(loader):\n"
        "-            images, labels = images.to(device), labels.to(device)\n"
        "+            images, labels = images.to(device, non_blocking=True), "
        "labels.to(device, non_blocking=True)\n"
        "             optimizer.zero_grad(set_to_none=True)\n"
        "             loss = loss_fn(model(images), labels)\n"
        "             loss.backward()\n"
    )  # the model's own .to(device) is left alone: only the loop's batch tensors


def test_a_call_without_a_trailing_comma_and_an_existing_keyword() -> None:
    diff = _diff(COMPUTE, "batch-size", {"loaders": {f"{COMPUTE}:39": {"batch_size": 512}}})
    assert diff is not None
    assert (
        "-    loader = DataLoader(dataset, sampler=batches, batch_size=None)  # each item is a whole batch"
        in diff
    )
    assert (
        "+    loader = DataLoader(dataset, sampler=batches, batch_size=512)  # each item is a whole batch"
        in diff
    )


def test_optimizer_and_flags() -> None:
    fused = _diff(COMPUTE, "fused-optimizer", {"loaders": {}, "runtime": {"fused_optimizer": True}})
    assert (
        fused is not None
        and "+    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, fused=True)" in fused
    )
    # each fix's diff holds its own change, even where the confirmation run merged several
    both = {"loaders": {}, "runtime": {"tf32": True, "cudnn_benchmark": True}}
    flags = _diff(COMPUTE, "tf32", both)
    assert flags is not None and flags.splitlines()[6:9] == [
        "+torch.backends.cuda.matmul.allow_tf32 = True",
        "+torch.backends.cudnn.allow_tf32 = True",
        " ",
    ]
    benchmark = _diff(COMPUTE, "cudnn-benchmark", both)
    assert benchmark is not None
    assert benchmark.splitlines()[6:8] == ["+torch.backends.cudnn.benchmark = True", " "]


def test_no_diff_where_the_change_has_no_single_place(tmp_path: Path) -> None:
    assert _diff(COMPUTE, "amp", {"loaders": {}, "runtime": {"amp": "bf16"}}) is None
    elsewhere = {"loaders": {"/somewhere/else.py:3": {"num_workers": 4}}}
    assert _diff(COMPUTE, "dataloader-workers", elsewhere) is None  # built in another file
    broken = tmp_path / "broken.py"
    broken.write_text("def (:\n")
    assert _diff(broken, "tf32", {"runtime": {"tf32": True}}) is None


def test_positional_arguments_star_kwargs_conflicts_and_host_copies(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "from torch.utils.data import DataLoader\n"
        "loader = DataLoader(data, 64, True)\n"
        "other = DataLoader(**options)\n"
        "opt = torch.optim.Adam(params, foreach=True)\n"
        "for x, y in loader:\n"
        "    x, y = x.to(device), y.to('cpu')\n"
    )
    site = f"{script.resolve()}:2"
    diff = _diff(script, "batch-size", {"loaders": {site: {"batch_size": 256}}, "non_blocking_h2d": True})
    assert diff is not None
    assert "+loader = DataLoader(data, 256, True)\n" in diff  # by position: no duplicate keyword
    assert "+    x, y = x.to(device, non_blocking=True), y.to('cpu')\n" in diff  # a host copy stays blocking
    starred = {"loaders": {f"{script.resolve()}:3": {"num_workers": 4}}}
    assert _diff(script, "dataloader-workers", starred) is None  # **options: no safe place
    assert _diff(script, "fused-optimizer", {"runtime": {"fused_optimizer": True}}) is None  # foreach=True
    flags = _diff(script, "tf32", {"runtime": {"tf32": True}})
    assert flags is not None and "+import torch\n" in flags  # the flags need the name


def test_tf32_is_written_in_the_api_the_script_uses(tmp_path: Path) -> None:
    """A script on torch >= 2.9's `fp32_precision` gets that API: adding the legacy flags would
    make torch raise ("mix of the legacy and new APIs") where the script reads them."""
    script = tmp_path / "train.py"
    script.write_text("import torch\n\ntorch.backends.cudnn.conv.fp32_precision = 'ieee'\nprint('train')\n")
    diff = _diff(script, "tf32", {"runtime": {"tf32": True}})
    assert diff is not None
    added = [line for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert added == [
        '+torch.backends.cuda.matmul.fp32_precision = "tf32"',
        '+torch.backends.cudnn.conv.fp32_precision = "tf32"',
    ]
