"""Fix `compile`: torch.compile on the module the optimizer trains, applied when the script
runs (no edit): the first module called whose parameters hold nine tenths or more of what the
optimizers train (the model, or the wrapper around it) is compiled in place (its compiled
forward called in place of the module's own call, as `module.compile()` does) before its next
call. Its trials restart the script (the optimizer and the first calls must see the compiled
module from the start); inductor's cache on disk carries compiled kernels from one trial to the
next and to the confirmation run.

Compiling costs time once: dynamo's own compile records give it (`compile_s`, see
`compute.dynamo`; where they are missing, the trial's warm-up beyond its settled step time).
The fix pays after `compile_s / (eager step - compiled step)` steps; it is kept only when the
run has more steps than that, and recommended with the figures where the run's length is not
known. Inductor fuses and reorders floating-point sums, so losses differ from eager in their
last bits and the difference grows as training goes on: losses must agree within
`loss_tolerance_rel` (1e-3 relative, far beyond reordering, far below what a changed update does)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from trainadvisor.fixes.common import Fix, Setting, overrides
from trainadvisor.memory.blocks import on_each_trained_module
from trainadvisor.records import FixOutcome, Overrides, Trial

_MODES_GPU = ("default", "reduce-overhead")  # reduce-overhead: CUDA graphs, for host-bound steps

# What a compile trial's run takes beyond the script's own before one has measured it: a fixed part
# (importing inductor, starting its compile workers, tracing, compiling the kernels' C++) and a part
# per aten op the model's part of the step dispatches (`model_aten_ops_per_step`: forward, loss and
# backward, nested ops too; not the optimizer's, which the fix does not compile). Fitted by
# `benchmarks/compile_prior.py` (cold inductor cache, five models of 126 to 1,012 ops a step) on the
# 2-core machines of two sessions, whose fits differ by 1.6-1.9x: 12.3 s + 11.0 ms and 13.7 s + 11.2
# ms an op on one (the trials' runs 12.0-28.0 s longer than the baseline's), 23.2 s + 16.6 ms on the
# other (21.3-43.7 s; one model of 202 ops took dynamo 20.7-20.9 s to compile in three runs there,
# 29.7 s in the session before). These constants lie between the two: 29-44% above the first's
# lines, 20-22% below the second's (no line is within 30% of both). A prior for the estimate and
# --budget only; the verdict uses the compile time dynamo records.
COMPILE_FIXED_S = 18.0
COMPILE_PER_OP_S = 0.014


class Compile(Fix):
    id = "compile"
    loss_tolerance_rel = 1e-3
    restarts_because = (
        "the model is compiled when it is first called, and its compiled kernels replace the "
        "eager ones for the rest of the run"
    )
    changed_training_hint = (
        "inductor draws dropout's random masks otherwise than eager PyTorch, so a model with dropout "
        "gives other losses for the same seed even where compiling changes nothing of what it learns: "
        "to check, profile with dropout off (p=0) and --fix compile"
    )

    def not_applicable(self, values: dict[str, Any]) -> str | None:
        if values.get("compiled_graphs"):
            return "the script already compiles with torch.compile"
        if "optimizer" not in values:
            return "no torch.optim optimizer stepped in the window: no trained module to compile"
        if (values.get("data_wait_pct") or 0.0) >= 20:
            return "the loop waits on its input: compiling the model cannot shorten that wait"
        return None

    def once_s(self, values: dict[str, Any]) -> float:
        ops = values.get("model_aten_ops_per_step")  # none on a trace without host ops: the fixed part
        return COMPILE_FIXED_S + COMPILE_PER_OP_S * (float(ops) if isinstance(ops, (int, float)) else 0.0)

    def could_keep(self, values: dict[str, Any]) -> bool:
        """Where compiling could pay over the run as the prior tells (`verdict` decides on the
        compile time measured): the run's length, or where it is not known the steps a run was
        seen to take, beyond the fewest steps it could pay after (the prior's compile time over
        the whole eager step: no compiled step saves more). A compile far quicker than the prior
        (inductor's cache warm) may be kept where this said no: the estimate then leaves out a
        confirmation that follows."""
        steps = values.get("run_total_steps") or values.get("run_seen_steps") or 0
        return steps > self.once_s(values) * float(values.get("steps_per_s") or 0.0)

    def measured_once_s(self, outcome: FixOutcome) -> float | None:
        return outcome.compile_s  # its trial's; the confirmation reads inductor's cache it left

    def expected_trials(self, values: dict[str, Any]) -> int:
        return len(_MODES_GPU) if values.get("cuda_used") else 1

    def next_candidate(self, values: dict[str, Any], trials: list[Trial]) -> Setting | None:
        modes = _MODES_GPU if values.get("cuda_used") else ("default",)
        if len(trials) >= len(modes):
            return None
        if trials and not _faster(trials[0], values):
            return None  # compiling did not help: CUDA graphs on top will not change that
        mode = modes[len(trials)]
        words = "torch.compile(model)" if mode == "default" else f'torch.compile(model, mode="{mode}")'
        return Setting(words, overrides(compile=mode))

    def choose(self, trials: list[Trial], values: dict[str, Any]) -> Trial | None:
        best = _fastest(trials)
        return best if best is not None and _faster(best, values) else None

    def verdict(self, trial: Trial, values: dict[str, Any]) -> tuple[str, str, dict[str, Any]] | None:
        """Whether compiling pays over the run: (status, reason, figures) where it does not or
        cannot be known, None where the run is long enough to keep it."""
        compile_s = compile_seconds(trial)
        base = float(values.get("steps_per_s") or 0.0)
        if compile_s is None or not base or not trial.steps_per_s:
            return None
        saved_s = 1.0 / base - 1.0 / trial.steps_per_s
        figures: dict[str, Any] = {"compile_s": compile_s}
        if saved_s <= 0:
            return None
        pool_s = pool_start_cost_s(trial)  # a one-time cost too: the compile workers' start-up
        break_even = math.ceil((compile_s + pool_s) / saved_s)
        figures["break_even_steps"] = break_even
        slowed = (
            f" (and the compile workers' start-up slowed its first steps by {pool_s:.1f} s)" if pool_s else ""
        )
        said = (
            f"compiling took {compile_s:.1f} s{slowed}{_warm_caches(trial)} and saves "
            f"{1e3 * saved_s:.2f} ms a step: it pays after {break_even} steps"
        )
        total, seen = values.get("run_total_steps"), values.get("run_seen_steps") or 0
        if total is None and seen > break_even:  # its length is not known, but it is this long
            return "", f"{said}; a run of the script took {seen} steps and went on", figures
        if total is None:
            unknown = f"the run's length is not known (a run took at least {seen} steps)"
            return "recommended", f"{said}; {unknown}, so it is not kept blind", figures
        if total <= break_even:
            return "no_gain", f"{said}, and the run has {total} steps", figures
        return "", f"{said}; the run has {total} steps", figures

    def measured_figures(self, trials: list[Trial]) -> dict[str, Any]:
        """The compile time of the fastest measured trial, where compiling was not kept too."""
        best = _fastest(trials)
        compile_s = compile_seconds(best) if best is not None else None
        return {"compile_s": compile_s} if compile_s is not None else {}

    def describe(self, trial: Trial, values: dict[str, Any]) -> str:
        return trial.label

    def search_note(self, trials: list[Trial], values: dict[str, Any]) -> str | None:
        """What compiling cost in each trial, beside its speed (a trial that was no faster
        says so with the numbers)."""
        base = values.get("steps_per_s")
        said = [
            f"{t.label}: compiling took {s:.1f} s{_pool_wait(t)}, then {t.steps_per_s:.1f} steps/s"
            + (f" against {base:.1f} eager" if base else "")
            for t in trials
            if t.status == "measured" and t.steps_per_s and (s := compile_seconds(t)) is not None
        ]
        return "; ".join(said) or None

    def install(self, recorder: Any, overrides: Overrides) -> None:
        mode = overrides.runtime.get("compile")
        if mode:
            install_compile(recorder, str(mode))

    def code_change(self, source: str, script: Path, overrides: Overrides) -> str | None:
        mode = overrides.runtime.get("compile")
        return compile_change(source, str(mode)) if mode else None


def _faster(trial: Trial, values: dict[str, Any]) -> bool:
    from trainadvisor.fixes.common import KEEP_MIN_SPEEDUP

    base = float(values.get("steps_per_s") or 0.0)
    return trial.status == "measured" and (trial.steps_per_s or 0.0) >= KEEP_MIN_SPEEDUP * base


def _fastest(trials: list[Trial]) -> Trial | None:
    """The measured trial with the most steps/s, or None."""
    measured = [t for t in trials if t.status == "measured" and t.steps_per_s]
    return max(measured, key=lambda t: t.steps_per_s or 0.0, default=None)


def _facts(trial: Trial) -> dict[str, Any]:
    """What torch.compile recorded in the trial's run (`compute.dynamo`; {} where nothing)."""
    return (trial.raw.runtime.get("compile") or {}) if trial.raw is not None else {}


def _pool_wait(trial: Trial) -> str:
    """Words for the warm-up steps left out while torch's compile workers started (see
    `compute.compilepool`); '' where there were none."""
    facts = _facts(trial)
    waited = facts.get("pool_start_wait_s")
    if not waited:
        return ""
    if facts.get("pool_starting_when_timed"):
        return (
            f" (torch's compile workers were still starting when its steps were timed, after {waited:.1f} s "
            "of warm-up beside them: the figure holds their start-up)"
        )
    return (
        f" (and {waited:.1f} s of steps beside torch's starting compile workers, left out of the measurement)"
    )


def pool_start_cost_s(trial: Trial) -> float:
    """What the compile workers' start-up cost the trial's first steps beyond its measured pace:
    the steps left out of its warm-up, less what they take at that pace. 0 where none were left
    out, or where dynamo recorded no compile time (`compile_seconds` then counts the whole warm-up
    beyond its settled steps, the start-up in it)."""
    facts = _facts(trial)
    if not facts.get("compile_s") or not trial.steps_per_s:
        return 0.0
    waited, steps = float(facts.get("pool_start_wait_s") or 0.0), int(facts.get("pool_start_steps") or 0)
    return max(waited - steps / trial.steps_per_s, 0.0)


def _warm_caches(trial: Trial) -> str:
    """Where the trial's graphs came from torch's on-disk caches (an earlier compile of the same
    model on this machine), words that say its compile time is a warm one; '' where it compiled
    them all."""
    facts = _facts(trial)
    hits, misses = int(facts.get("compile_cache_hits") or 0), int(facts.get("compile_cache_misses") or 0)
    if not hits:
        return ""
    return (
        f" with {hits} of {hits + misses} graphs read from torch's on-disk compile caches (warm from "
        "an earlier compile here: where they are cold, as on a new machine or in CI, compiling takes "
        "longer and pays later)"
    )


def compile_seconds(trial: Trial) -> float | None:
    """The trial's compile time: dynamo's own record, else its warm-up beyond what its settled
    steps would have taken (the first steps compile the forward and the backward)."""
    raw = trial.raw
    if raw is None:
        return None
    recorded = _facts(trial).get("compile_s")
    if recorded:
        return float(recorded)
    shape = raw.shape
    if shape is None or not trial.steps_per_s:
        return None
    return max(shape.warmup_s - shape.warmup_steps / trial.steps_per_s, 0.0)


def install_compile(recorder: Any, mode: str, backend: str | None = None) -> None:
    """Compile each module an optimizer trains (`memory.blocks.on_each_trained_module`: a GAN's
    two models both) before its first call. `backend`: inductor unless named (tests name
    "eager": which module, not inductor)."""
    import torch

    def compile_it(module: torch.nn.Module) -> None:
        options: dict[str, Any] = {} if mode == "default" else {"mode": mode}
        if backend is not None:
            options["backend"] = backend
        compiled = torch.compile(module.forward, **options)  # type: ignore[call-overload]
        if hasattr(module, "_compiled_call_impl"):  # what `module.compile()` sets, torch >= 2.2
            # (its own compile of `_call_impl` runs eagerly on torch 2.13: dynamo skips nn's
            # frames; the forward compiles, and the module's own hooks are not run by it)
            module._compiled_call_impl = compiled
            recorder.on_uninstall(lambda: setattr(module, "_compiled_call_impl", None))
        else:
            module.forward = compiled
        named = getattr(recorder, "compiled_module", "")
        recorder.compiled_module = f"{named}, {type(module).__name__}" if named else type(module).__name__

    on_each_trained_module(recorder, compile_it)


def compile_change(source: str, mode: str) -> str | None:
    """Each trained model's forward compiled in place, after the statement that builds it
    (`after_models`: every model an optimizer is built from, as the trial compiled each):
    `model.forward = torch.compile(model.forward)`. In place, the module stays itself: its
    `state_dict` keeps its keys (torch.compile(model) returns a wrapper whose keys gain
    `_orig_mod.`), so checkpoints saved before and after the change load into either, and a
    `load_state_dict` later in the script needs no reordering."""
    options = "" if mode == "default" else f', mode="{mode}"'
    from trainadvisor.fixes.codechange import after_models  # libcst: not in the measured run

    def lines(name: str) -> list[str]:
        # the comment says why not `torch.compile(model)`, whose wrapper changes the keys
        return [f"{name}.forward = torch.compile({name}.forward{options})  # in place: same state_dict keys"]

    def fit_lines(name: str) -> list[str]:  # Lightning unwraps a compiled module when it saves
        return [f"{name} = torch.compile({name}{options})"]

    code = after_models(source, lines, fit_lines)
    if code is None:
        return None
    return code if "import torch\n" in code else "import torch\n" + code
