"""Fix `ddp-settings`: `DistributedDataParallel` built with the settings that cost nothing to
change and slow every step when left: `find_unused_parameters=False` where the run saw no
parameter go unused (with it on, DDP walks the autograd graph after every forward to find them),
`gradient_as_bucket_view=True` (gradients live in the all-reduce buckets: one copy less per
step), and buckets of at least DDP's default 25 MiB (a tiny `bucket_cap_mb` splits the gradients
into many small all-reduces, each paying the collective's latency); then larger buckets, which
start fewer, longer all-reduces, while the last size tried did not already hold all the
model's gradients (the parameters' bytes measured at the step's peak: a larger bucket then
changes nothing, and its torchrun trial is not run); with gradient accumulation (several backward() calls per
optimizer step, and no `no_sync()` of the script's own), the first candidate also skips the
gradient all-reduce on each micro-step but the last, as `model.no_sync()` does (the gradients
accumulate locally and are all-reduced once, summed); last, `static_graph=True` where the
graph looks static (no parameter went unused, every step drew batches of the same shapes): DDP
then skips its per-step bookkeeping of which gradients to expect. Each candidate is a torchrun
trial of the script as it is, kept only if faster and the loss of the same seeded steps is
unchanged on every rank (a graph that is not static after all changes the gradients, or fails
the trial). The code change sets DDP's arguments at the line that builds it; `no_sync()` belongs
in the script's loop, which the finding's best practice shows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainadvisor.fixes.common import KEEP_MIN_SPEEDUP, Fix, Setting, overrides
from trainadvisor.records import Overrides, Trial

DEFAULT_BUCKET_CAP_MB = 25.0  # DDP's own default
LARGER = 4  # the next candidate's buckets, times the last size tried
MAX_BUCKETS = 3  # bucket sizes tried at most: 25, 100, 400 MiB from a tiny one
MIB = 2**20  # DDP's bucket_cap_mb counts MiB
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
        if not self._changes(values) and not _static_possible(values) and not _micro_steps(values):
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
        first = bool(self._changes(values) or _micro_steps(values))  # at most: every size gains
        return (_bucket_sizes(self._first_cap_mb(values), values) if first else 0) + (
            1 if _static_possible(values) else 0
        )

    def next_candidate(self, values: dict[str, Any], trials: list[Trial]) -> Setting | None:
        first, micro = self._changes(values), _micro_steps(values)
        if (first or micro) and not trials:
            return _setting(first, micro)
        if (first or micro) and (larger := self._larger_buckets(values, trials)) is not None:
            return larger
        if not _static_possible(values) or any(_ddp(t).get("static_graph") for t in trials):
            return None
        best = self.choose(trials, values)
        kept = best.overrides.runtime.get("ddp_no_sync") if best is not None else None
        return _setting({**(_ddp(best) if best is not None else {}), "static_graph": True}, kept)

    def _larger_buckets(self, values: dict[str, Any], trials: list[Trial]) -> Setting | None:
        """Buckets LARGER times the last size tried, while each size gained: after the first
        candidate where it was faster than the baseline, then again (up to MAX_BUCKETS sizes)
        where the larger size was faster than the size before it."""
        sized = [t for t in trials if not _ddp(t).get("static_graph")]
        if len(sized) >= MAX_BUCKETS or len(sized) != len(trials) or not _gained(sized[-1], values):
            return None
        if len(sized) > 1 and (sized[-1].steps_per_s or 0.0) < KEEP_MIN_SPEEDUP * (
            sized[-2].steps_per_s or 0.0
        ):
            return None  # the last step up did not pay: larger still will not either
        first = self._changes(values)
        cap = float(_ddp(sized[-1]).get("bucket_cap_mb") or self._first_cap_mb(values))
        if _held_in_one(cap, values) is not None:
            return None  # one bucket of the last size held every gradient: a larger one is the same
        return _setting({**first, "bucket_cap_mb": cap * LARGER}, _micro_steps(values))

    def _first_cap_mb(self, values: dict[str, Any]) -> float:
        """The first candidate's bucket size: the one it sets, else the script's own."""
        first = self._changes(values).get("bucket_cap_mb")
        return float(first or values.get("ddp_bucket_cap_mb") or DEFAULT_BUCKET_CAP_MB)

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
        sized = [t for t in trials if not _ddp(t).get("static_graph") and t.status == "measured"]
        cap = float(_ddp(sized[-1]).get("bucket_cap_mb") or 0.0) if sized else 0.0
        held = _held_in_one(cap, values) if cap else None
        if held is None or len(sized) >= MAX_BUCKETS:
            return None
        if not _gained(sized[-1], values):
            return None  # the search stopped on the size's own figure, not on the model's size
        return (
            f"no larger bucket tried: the model's {held / MIB:.3g} MiB of gradients fit in one of "
            f"{cap:g} MiB, so a larger size changes nothing"
        )

    def install(self, recorder: Any, overrides: Overrides) -> None:
        """Build every DistributedDataParallel with the candidate's settings; with
        `ddp_no_sync`, skip the all-reduce on each micro-step but the last."""
        settings, micro = overrides.runtime.get("ddp"), overrides.runtime.get("ddp_no_sync")
        if not settings and not micro:
            return
        import torch

        ddp = torch.nn.parallel.DistributedDataParallel
        if settings:
            original = ddp.__init__

            def init(self: Any, *args: Any, **kwargs: Any) -> None:
                original(self, *args, **{**kwargs, **settings})

            recorder.patch(ddp, "__init__", init)
        if micro:
            _install_no_sync(recorder, ddp, int(micro))

    def loop_change(self, overrides: Overrides) -> str:
        micro = overrides.runtime.get("ddp_no_sync")
        if not micro:
            return ""
        return (
            f"in the training loop, run the forward and backward of each micro-step but every "
            f"{micro}th inside `with model.no_sync():` (the DDP model), so that DDP all-reduces the "
            "accumulated gradients once per optimizer step (the comm-bound finding's best practice "
            "shows it)"
        )

    def code_change(self, source: str, script: Path, overrides: Overrides) -> str | None:
        from trainadvisor.fixes import codechange  # libcst: not in the measured run

        settings = overrides.runtime.get("ddp") or {}
        return codechange.edit_calls(source, NAMES, None, dict(settings)) if settings else None


def _install_no_sync(recorder: Any, ddp: Any, micro: int) -> None:
    """DDP's forward with `require_backward_grad_sync` (what `no_sync()` sets) off on each
    forward that records a graph but every `micro`-th since the last optimizer step."""
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    forward, since_step = ddp.forward, [0]

    def no_sync_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        if torch.is_grad_enabled():
            since_step[0] += 1
            # from the micro-th on: an extra forward before the step syncs (slower, not wrong)
            self.require_backward_grad_sync = since_step[0] >= micro
        return forward(self, *args, **kwargs)

    def stepped(*_: Any) -> None:
        since_step[0] = 0

    recorder.patch(ddp, "forward", no_sync_forward)
    recorder.on_uninstall(register_optimizer_step_post_hook(stepped).remove)


def _micro_steps(values: dict[str, Any]) -> int | None:
    """Micro-steps per optimizer step where the script accumulates gradients across several
    backward() calls without DDP's no_sync(), else None."""
    count = int(values.get("backwards_per_step") or 0)
    if count < 2 or values.get("ddp_no_sync_used") is not False or not values.get("backwards_even"):
        return None  # every timed step the same count: else a step could end unsynced
    return count


def _static_possible(values: dict[str, Any]) -> bool:
    """DDP's graph looks static: not static already, no parameter went unused (or none was
    searched for), every step drew batches of the same shapes, one backward() per step."""
    if values.get("ddp_static_graph") or not values.get("input_shapes_fixed"):
        return False
    if int(values.get("backwards_per_step") or 0) >= 2:  # syncs that differ by micro-step
        return False  # (DDP's reducer asserts on a static graph with no_sync)
    return not values.get("ddp_find_unused_parameters") or values.get("ddp_unused_parameter_bytes") == 0


def _gradient_bytes(values: dict[str, Any]) -> float | None:
    """The most the gradients DDP buckets can take: the parameters' bytes (or the gradients',
    where larger) at the step's peak; None where the memory of a step was not measured."""
    held = [float(values[k]) for k in ("parameters_bytes", "gradients_bytes") if values.get(k)]
    return max(held) if held else None


def _held_in_one(cap_mb: float, values: dict[str, Any]) -> float | None:
    """The gradients' bytes where one bucket of `cap_mb` holds them all (the search's larger
    sizes change nothing), else None."""
    held = _gradient_bytes(values)
    return held if held is not None and cap_mb * MIB >= held else None


def _bucket_sizes(first_mb: float, values: dict[str, Any]) -> int:
    """The bucket sizes the search tries at most from `first_mb`: LARGER times each, up to
    MAX_BUCKETS, and none past the first that holds every gradient."""
    sizes, cap = 1, first_mb
    while sizes < MAX_BUCKETS and _held_in_one(cap, values) is None:
        sizes, cap = sizes + 1, cap * LARGER
    return sizes


def _ddp(trial: Trial) -> dict[str, Any]:
    return dict(trial.overrides.runtime.get("ddp") or {})


def _setting(changes: dict[str, Any], micro: int | None = None) -> Setting:
    said = [
        f"{key}={value:g}" if isinstance(value, float) else f"{key}={value}" for key, value in changes.items()
    ]
    if micro:
        said.append(f"no_sync() on {micro - 1} of every {micro} micro-steps")
    runtime: dict[str, Any] = {"ddp": changes} if changes else {}
    if micro:
        runtime["ddp_no_sync"] = micro
    return Setting(", ".join(said), overrides(**runtime))


def _gained(trial: Trial, values: dict[str, Any]) -> bool:
    baseline = float(values.get("steps_per_s") or 0.0)
    return trial.status == "measured" and (trial.steps_per_s or 0.0) >= KEEP_MIN_SPEEDUP * baseline > 0
