"""trainadvisor: profile a PyTorch training loop, diagnose what holds it back, rerun it with the
fixes applied and report the measured before/after.

From the command line: `trainadvisor profile train.py [script args]`.

Steps are found through `torch.optim` optimizers, or through backward() where the script builds
none; a loop can also mark each step with `trainadvisor.step()`, which does nothing outside a
trainadvisor run.

May import: advising, training, report (a saved report in a notebook), _version."""

from __future__ import annotations

from trainadvisor._version import __version__

__all__ = ["advise", "load_report", "step", "__version__"]


def __getattr__(name: str) -> object:
    # `advise` imports torch: loaded on first use, so `import trainadvisor` stays light (the
    # command-line parent process never imports torch).
    if name == "advise":
        from trainadvisor.advising.advisor import advise

        return advise
    if name == "load_report":  # a saved report in a notebook (`report.notebook`)
        from trainadvisor.report.notebook import load_report

        return load_report
    raise AttributeError(f"module 'trainadvisor' has no attribute {name!r}")


def step() -> None:
    """Mark the end of one training step.

    Needed only when the script does not step a `torch.optim` optimizer (steps are found through
    the optimizers' global step hooks otherwise). Once called, optimizer steps are no longer
    counted, so a step is never counted twice. Outside a trainadvisor run this is a no-op."""
    from trainadvisor.training import hooks

    if hooks.ACTIVE is not None:
        hooks.ACTIVE.manual_step()
