"""Fix `ddp-settings`: `DistributedDataParallel` built with the settings that cost nothing to
change and slow every step when left: `find_unused_parameters=False` where the run saw no
parameter go unused (with it on, DDP walks the autograd graph after every forward to find them),
`gradient_as_bucket_view=True` (gradients live in the all-reduce buckets: one copy less per
step), and buckets of at least DDP's default 25 MiB (a tiny `bucket_cap_mb` splits the gradients
into many small all-reduces, each paying the collective's latency); then larger buckets, which
start fewer, longer all-reduces; last, `static_graph=True` where the graph looks static (no
parameter went unused, every step drew batches of the same shapes): DDP then skips its per-step
bookkeeping of which gradients to expect. Each candidate is a torchrun trial of the script as it
is, kept only if faster and the loss of the same seeded steps is unchanged on every rank (a graph
that is not static after all changes the gradients, or fails the trial)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainadvisor.fixes.common import KEEP_MIN_SPEEDUP, Fix, Setting, overrides
from trainadvisor.records import Overrides, Trial

DEFAULT_BUCKET_CAP_MB = 25.0  # DDP's own default
LARGER = 4  # the next candidate's buckets, times the first's
NAMES = {"DistributedDataParallel", "DDP"}


class DdpSettings(Fix):
    id = "ddp-settings"
    restarts_because = "DDP reads its settings when the script builds the wrapper"
    # the same gradients, summed in other buckets: float sums in another order
    loss_tolerance_rel = 1e-4

    def not_applicable(self, values: dict[str, Any]) -> str | None:
        if not values.get("ddp_modules"):
            return "the script builds no DistributedDataParallel"
        if int(values.get("ddp_world_size") or 0) < 2:
            return "DDP over one process communicates nothing"
        if not self._changes(values) and not _static_possible(values):
            return "DDP is built with the settings this fix would set"
        return None

    def _changes(self, values: dict[str, Any]) -> dict[str, Any]:
        """What the first candidate changes of the script's settings."""
        changes: dict[str, Any] = {}
        unused = values.get("ddp_unused_parameter_bytes")
        if values.get("ddp_find_unused_parameters") and unused == 0:
            changes["find_unused_parameters"] = False
        if values.get("ddp_gradient_as_bucket_view") is False:
            changes["gradient_as_bucket_view"] = True
        if float(values.get("ddp_bucket_cap_mb") or DEFAULT_BUCKET_CAP_MB) < DEFAULT_BUCKET_CAP_MB:
            changes["bucket_cap_mb"] = DEFAULT_BUCKET_CAP_MB
        return changes

    def expected_trials(self, values: dict[str, Any]) -> int:
        return (2 if self._changes(values) else 0) + (1 if _static_possible(values) else 0)

    def next_candidate(self, values: dict[str, Any], trials: list[Trial]) -> Setting | None:
        first = self._changes(values)
        if first and not trials:
            return _setting(first)
        if first and len(trials) == 1 and _gained(trials[0], values):
            # larger buckets are worth a trial only where the first setting helped
            cap = float(
                first.get("bucket_cap_mb") or values.get("ddp_bucket_cap_mb") or DEFAULT_BUCKET_CAP_MB
            )
            return _setting({**first, "bucket_cap_mb": cap * LARGER})
        if not _static_possible(values) or any(_ddp(t).get("static_graph") for t in trials):
            return None
        best = self.choose(trials, values)
        return _setting({**(_ddp(best) if best is not None else {}), "static_graph": True})

    def choose(self, trials: list[Trial], values: dict[str, Any]) -> Trial | None:
        faster = [t for t in trials if _gained(t, values)]
        return max(faster, key=lambda t: t.steps_per_s or 0.0, default=None)

    def search_note(self, trials: list[Trial], values: dict[str, Any]) -> str | None:
        if values.get("ddp_find_unused_parameters") and values.get("ddp_unused_parameter_bytes"):
            unused = values["ddp_unused_parameter_bytes"]
            return (
                f"find_unused_parameters stays on: {unused} bytes of parameters went unused in a step "
                "(DDP would wait for their gradients forever without it)"
            )
        return None

    def install(self, recorder: Any, overrides: Overrides) -> None:
        """Build every DistributedDataParallel with the candidate's settings."""
        settings = overrides.runtime.get("ddp")
        if not settings:
            return
        import torch

        ddp = torch.nn.parallel.DistributedDataParallel
        original = ddp.__init__

        def init(self: Any, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **{**kwargs, **settings})

        recorder.patch(ddp, "__init__", init)

    def code_change(self, source: str, script: Path, overrides: Overrides) -> str | None:
        from trainadvisor.fixes import codechange  # libcst: not in the measured run

        settings = overrides.runtime.get("ddp") or {}
        return codechange.edit_calls(source, NAMES, None, dict(settings)) if settings else None


def _static_possible(values: dict[str, Any]) -> bool:
    """DDP's graph looks static: not static already, no parameter went unused (or none was
    searched for), and every step drew batches of the same shapes."""
    if values.get("ddp_static_graph") or not values.get("input_shapes_fixed"):
        return False
    return not values.get("ddp_find_unused_parameters") or values.get("ddp_unused_parameter_bytes") == 0


def _ddp(trial: Trial) -> dict[str, Any]:
    return dict(trial.overrides.runtime.get("ddp") or {})


def _setting(changes: dict[str, Any]) -> Setting:
    said = (
        f"{key}={value:g}" if isinstance(value, float) else f"{key}={value}" for key, value in changes.items()
    )
    return Setting(", ".join(said), overrides(ddp=changes))


def _gained(trial: Trial, values: dict[str, Any]) -> bool:
    baseline = float(values.get("steps_per_s") or 0.0)
    return trial.status == "measured" and (trial.steps_per_s or 0.0) >= KEEP_MIN_SPEEDUP * baseline > 0
