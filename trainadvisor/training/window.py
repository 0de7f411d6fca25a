"""One measuring window over the steps of a running training loop: a warm-up of at least
`warmup` steps that lasts until step time has settled (`measure.settle`), then at least `steps`
steps timed with clocks alone for at least `min_time_s`, then (when asked) the profiler's warmup
step and `profile_steps` steps traced with torch.profiler, whose overhead would bias the timing.
Where the script has only so many steps left (`max_steps`), warm-up and timed steps end there.
Profile's child (`training.hooks.Recorder`) and `@advise` (`advisor.Advisor`) both drive one; the
child then goes on through a sequence of trial windows in the same process (`training.session`).

The window knows nothing of how steps are found: its owner calls `boundary()` at the end of each
step and reports what happened inside it (`add_data_wait`, `add_batch`, `set_loss`,
`mark_backward`). Clocks are injected (`Clock`), so tests drive a window with exact numbers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch

from trainadvisor.compute.compilepool import PoolWait
from trainadvisor.compute.dynamo import compile_facts
from trainadvisor.compute.flops import StepFlops, compiled_frames, measure_cpu_peak_facts
from trainadvisor.fixes import switches
from trainadvisor.measure.config import traced_whole
from trainadvisor.measure.race import lost_in_timed, lost_in_warmup
from trainadvisor.measure.settle import Blocks, noise_tolerance, relative_se
from trainadvisor.memory.step import StepMemory
from trainadvisor.records import StepRecord, WindowShape
from trainadvisor.training import gpu
from trainadvisor.training.window_plan import Clock, WindowFacts, WindowPlan, start_profiler

Phase = Literal["warmup", "timed", "traced", "done"]

MAX_SLIDES = 2  # times the timed steps may start over when their halves differ
# A step that runs compiled code is not measured for memory: dynamo skips any frame that must
# compile while a dispatch mode is active, and the skip sticks for the rest of the process (a new
# shape on the counted step would run eager from then on, and later windows compare an eager
# model with a compiled baseline).
COMPILED_MEMORY = (
    "not measured: the step runs code torch.compile compiled (measuring it would make dynamo skip "
    "the frames it must compile, for the rest of the run)"
)


class Window:
    """The steps of one window, from the step numbered `first_index` on. `on_open` runs when the
    timed steps begin (it returns torch's runtime facts), `on_close` when the last step is in."""

    def __init__(
        self,
        plan: WindowPlan,
        clock: Clock | None = None,
        first_index: int = 0,
        device: int | None = None,
        on_open: Callable[[Window], dict[str, Any]] | None = None,
        on_close: Callable[[Window], None] | None = None,
        profiler: Callable[[int, bool], Any] = start_profiler,
    ) -> None:
        self.plan, self.clock, self.first_index = plan, clock or Clock(), first_index
        self.device = device  # the GPU the losses were on
        self.on_open, self.on_close, self.make_profiler = on_open, on_close, profiler
        self.phase: Phase = "warmup"
        self.steps_done = 0
        self.records: list[StepRecord] = []
        self.losses: list[torch.Tensor | None] = []  # one per step, warmup included
        self.batch_fingerprints: list[str | None] = []
        self.facts = WindowFacts()
        self.gpu = gpu.GpuWindow()
        self.profiler: Any = None
        self.t0 = 0.0
        self.start_unix_s: float | None = None
        self.end_unix_s: float | None = None
        self.last_mark = self.opened_at = self.clock.perf_s()
        self.blocks = Blocks(plan.settle) if plan.settle is not None else None
        self.blocks_since: float | None = self.opened_at if plan.warmup == 0 else None
        self.blocks_from = self.blocks_since  # and the blocks, after any start-up of torch's compile pool
        self.shape = WindowShape(0, 0.0, "count", min_time_s=plan.min_time_s)
        self.shape_timed_steps = 0
        self.slides = 0
        self.pool = PoolWait()  # warm-up steps left out while torch's compile pool started
        self.flops: StepFlops | None = None  # the FLOPs of one traced step
        self.memory: StepMemory | None = None  # and what fills its memory
        self.switched_at_open: dict[str, int] | None = None  # the switches' counts when timing began
        self._reset_step()
        if plan.warmup == 0 and plan.settle is None:
            self._open(self.last_mark, "count")

    def _reset_step(self) -> None:
        self.data_wait_s = 0.0
        self.ready_draws: list[bool] = []  # whether each batch drawn was loaded ahead (where told)
        self.ready_counts: list[int] = []  # the batches loaded and waiting at each draw (where told)
        self.samples: int | None = None
        self.loss: torch.Tensor | None = None
        self.backward_at: float | None = None
        self.backwards = 0
        self.batches: list[str] = []

    # ---- what happened inside the step ----

    @property
    def measuring(self) -> bool:
        return self.phase in ("timed", "traced")

    def add_data_wait(self, seconds: float, ready: bool | None = None, count: int | None = None) -> None:
        self.data_wait_s += seconds
        if ready is not None:
            self.ready_draws.append(ready)
        if count is not None:  # the batches waiting then
            self.ready_counts.append(count)

    def add_batch(self, samples: int | None, fingerprint: str | None = None) -> None:
        if samples is not None and self.measuring:
            self.samples = (self.samples or 0) + samples
        if fingerprint:
            self.batches.append(fingerprint)

    def mark_backward(self) -> None:
        self.backwards += 1
        if self.backward_at is None:
            self.backward_at = self.clock.perf_s()

    def set_loss(self, tensor: torch.Tensor) -> None:
        if self.device is None and tensor.device.type == "cuda":
            self.device = tensor.device.index
        if tensor.numel() == 1:
            # A copy, not a view: under CUDA graphs (torch.compile's reduce-overhead mode) the
            # loss is a static output buffer that the next replay overwrites, and reading it
            # after that raises.
            self.loss = tensor.detach().clone()

    def optimizer_stepped(self, optimizer: torch.optim.Optimizer, counted: bool) -> None:
        self.facts.optimizer_ids.add(id(optimizer))
        if counted and self.facts.optimizer is None:
            self.facts.optimizer = optimizer

    def restart_step(self) -> None:
        """The step failed (it raised): what was measured of it is dropped; the next starts now."""
        self._reset_step()
        self.last_mark = self.clock.perf_s()

    # ---- the step's end ----

    def boundary(self) -> None:
        """One step ended: record it, and move to the next phase when this one is complete."""
        if self.phase == "done":
            return
        now = self.clock.perf_s()
        if self.phase == "timed" and self._timed_done(now, len(self.records) + 1, self.steps_done + 1):
            self.gpu.sync()  # the last timed step ends when its GPU work does
            now = self.clock.perf_s()
        self.steps_done += 1
        self.losses.append(self.loss)
        self.batch_fingerprints.append("|".join(self.batches) or None)
        if self.measuring:
            self._record(now)
        else:
            self._warmed(now)
        self._reset_step()
        self.last_mark = self.clock.perf_s()

    def _warmed(self, now: float) -> None:
        """A warm-up step ended: open the timed steps once the warm-up is complete."""
        if self.blocks is not None and self.steps_done > self.plan.warmup:
            if self.pool.leaves_out(
                now - self.last_mark, now - self._capped_from(), self.blocks.settling.max_s
            ):
                self.blocks_from = now  # a start-up beside the loop: the blocks and their cap come after
            else:
                # the first `warmup` steps stay out of the blocks
                self.blocks.add(now - self.last_mark, self._ready())
        elif self.steps_done == self.plan.warmup:
            self.blocks_since = self.blocks_from = now
        end = self._warmup_end(now)
        if end is not None:
            self._open(now, end)

    def _drawn(self) -> tuple[bool | None, int | None]:
        """Whether every batch this step drew was loaded ahead, and how many were waiting then
        (summed over its draws); None where it could not be told."""
        ahead = all(self.ready_draws) if self.ready_draws else None
        return ahead, sum(self.ready_counts) if self.ready_counts else None

    def _ready(self) -> int | None:
        """The batches waiting when this step drew its own, where every batch it drew was loaded
        ahead (`Blocks.add`); None where one was not, or it could not be told."""
        ahead, waiting = self._drawn()
        return waiting if ahead else None

    def _capped_from(self) -> float:
        """Where the warm-up's time cap counts from: the end of the counted warm-up steps (a cold
        compile of a real model, a minute and more in the first step, leaves the loop its whole
        time to settle), the window's opening where there are none."""
        return self.blocks_since if self.blocks_since is not None else self.opened_at

    def _warmup_end(self, now: float) -> str | None:
        """Why the warm-up ends at this step, or None while it goes on."""
        if self.steps_done < self.plan.warmup:
            return None
        cap = self.plan.warmup_cap
        if self.blocks is None:
            return "count"
        if self.blocks.settled:
            return "settled"
        below = self.plan.race_below if self.plan.race_warmup else None
        if below is not None and lost_in_warmup(self.blocks, below):
            return "raced"
        if now - self._capped_from() >= self.blocks.settling.max_s:
            return "time cap"
        blocks_max_s = self.blocks.settling.blocks_max_s
        if (
            blocks_max_s is not None
            and self.blocks_from is not None
            and now - self.blocks_from >= blocks_max_s
        ):
            return "settle cap"
        if cap is not None and self.steps_done >= cap:
            return "step cap"
        return None

    def _timed_done(self, now: float, recorded: int, steps_done: int) -> bool:
        """Whether the timed steps are complete with `recorded` of them, the window's
        `steps_done`-th step ending at `now`."""
        if self.plan.max_steps is not None and steps_done >= self.plan.max_steps:
            return True
        if self._raced(now, recorded):
            return True
        return recorded >= self.plan.steps and now - self.t0 >= self.plan.min_time_s

    def _raced(self, now: float, recorded: int) -> bool:
        """Whether the timed steps stop here, the race lost (`measure.race`): after a warm-up
        that lost it, once one block's worth is timed; else once that much shows the window's
        steps/s cannot reach `race_below`."""
        settle, below = self.plan.settle, self.plan.race_below
        if settle is None or below is None:
            return False
        scale = self.blocks.scale if self.blocks is not None else 1
        enough = recorded >= scale * settle.block_steps and now - self.t0 >= scale * settle.block_s - 1e-9
        if not enough:
            return False
        return self.shape.warmup_end == "raced" or lost_in_timed(recorded, now - self.t0, below, settle)

    def _record(self, now: float) -> None:
        pre_backward_s = self.backward_at - self.last_mark if self.backward_at is not None else None
        timed = self.phase == "timed"
        ahead, waiting = self._drawn()
        self.records.append(
            StepRecord(
                index=self.first_index + self.steps_done - 1,
                start_ms=(self.last_mark - self.t0) * 1e3,
                step_ms=(now - self.last_mark) * 1e3,
                data_wait_ms=self.data_wait_s * 1e3,
                loaded_ahead=ahead,
                ready_batches=waiting,
                samples=self.samples,
                profiled=self.phase == "traced",  # untimed: traced, or its memory measured
                pre_backward_ms=pre_backward_s * 1e3 if pre_backward_s is not None else None,
                backwards=self.backwards,
            )
        )
        if timed:
            self.gpu.mark()
            if not self._timed_done(now, len(self.records), self.steps_done):
                return
            if not self._raced(now, len(self.records)) and self._changing(now):
                self._slide()
            else:
                self._end_timed(now)
        else:
            if self._counting() and len(self.records) == self.shape_timed_steps + 1:
                self._stop_counting()
            if len(self.records) == self.shape_timed_steps + self.plan.traced_steps:
                self._close()
            elif self.profiler is not None:
                self.profiler.step()

    def _changing(self, now: float) -> bool:
        """Whether the timed steps' first half and second half differ in time per step beyond
        the settling tolerance (widened to the halves' chance spread, `settle.noise_tolerance`):
        the warm-up settled on a plateau the loop has since left (a slow phase that lasted three
        blocks). Not tested where the warm-up was a count, where
        the script has no steps to spare, past the warm-up's time cap, after MAX_SLIDES slides
        (a loop whose halves never agree is timed as it is), or where a half is shorter than a
        warm-up block of the size the warm-up settled on (a period longer than the half, such
        as a DataLoader rebuilt every short epoch, would make its halves differ by chance)."""
        settle = self.plan.settle
        if settle is None or self.plan.max_steps is not None or now - self.opened_at >= settle.max_s:
            return False
        if self.slides >= MAX_SLIDES:
            return False
        half = len(self.records) // 2
        scale = self.blocks.scale if self.blocks is not None else 1
        if half < scale * settle.block_steps:
            return False
        halves = [[r.step_ms for r in self.records[:half]], [r.step_ms for r in self.records[half:]]]
        first, second = (sum(steps) / len(steps) for steps in halves)
        tolerance = noise_tolerance(settle, max(relative_se(steps) for steps in halves))
        return max(first, second) > (1.0 + tolerance) * min(first, second)

    def _slide(self) -> None:
        """The timed steps' first half becomes warm-up: timing goes on from the second half."""
        half = len(self.records) // 2
        shift_ms = self.records[half].start_ms
        self.records = self.records[half:]
        del self.gpu.events[:half]  # the event that ended the last dropped step starts the rest
        for record in self.records:
            record.start_ms -= shift_ms
        self.t0 += shift_ms / 1e3
        if self.start_unix_s is not None:
            self.start_unix_s += shift_ms / 1e3
        self.shape.warmup_steps += half
        self.shape.warmup_s += shift_ms / 1e3
        if self.shape.settle_s is not None:
            self.shape.settle_s += shift_ms / 1e3
        self.shape.slid_steps += half
        self.slides += 1

    def _end_timed(self, now: float) -> None:
        self.shape.timed_s = now - self.t0
        capped = self.plan.max_steps is not None and self.steps_done >= self.plan.max_steps
        unmet = len(self.records) < self.plan.steps or self.shape.timed_s < self.plan.min_time_s
        raced = unmet and self._raced(now, len(self.records))
        self.shape.timed_end = "step cap" if capped and unmet else "raced" if raced else "plan"
        self.shape_timed_steps = len(self.records)
        if not self.plan.traced_steps or raced:  # a lost race measures nothing more
            self._close()
            return
        self.phase = "traced"
        if self.plan.profile_steps:
            self.profiler = self.make_profiler(self.plan.profile_steps, self.plan.with_stack)
            self.flops = StepFlops()  # the profiler's warm-up step, untimed, is counted
            self.flops.start()
        self.gpu.keep_peaks()  # the memory step resets the allocator's peaks: the timed steps' first
        self.memory = StepMemory()  # and its memory measured (inside the counter: left first)
        if compiled_frames():  # its dispatch mode would make dynamo skip, for good, what it must compile
            self.memory.status = COMPILED_MEMORY
        else:
            self.memory.start(self.facts.optimizer, self._cuda_device())

    def _cuda_device(self) -> int | None:
        if not gpu.cuda_in_use():
            return None
        return self.device if self.device is not None else torch.cuda.current_device()

    def _counting(self) -> bool:
        return self.flops is not None or self.memory is not None

    def _stop_counting(self, whole: bool = True) -> None:
        """The counted step ended (or, not `whole`, the script did inside it): leave its modes,
        innermost first, and record what they measured; of a step cut short, that nothing was
        measured (its peak and FLOPs would be a part of a step's, taken for a step's)."""
        cut = "not measured: the script ended inside the counted step"
        if self.memory is not None:
            self.memory.stop()
            self.facts.runtime["memory"] = self.memory.facts() if whole else {"status": cut}
            self.memory = None
        if self.flops is not None:
            self.flops.stop()
            self.facts.runtime.update(self.flops.facts() if whole else {"flops_status": cut})
            self.flops = None

    def _open(self, now: float, end: str) -> None:
        block_ms = list(self.blocks.block_ms) if self.blocks is not None else []
        settle_s = (
            now - self.blocks_from if self.blocks is not None and self.blocks_from is not None else None
        )
        self.pool.opened()
        self.shape = WindowShape(
            self.steps_done,
            now - self.opened_at,
            end,
            block_ms,
            min_time_s=self.plan.min_time_s,
            settle_s=settle_s,
        )
        if self.on_open is not None:
            self.facts.runtime = self.on_open(self)
        self.switched_at_open = dict(switches.SWITCHED)
        self.phase = "timed"
        self.start_unix_s = self.clock.unix_s()
        self.gpu.start(self.device if self.device is not None else gpu.training_device(None))
        self.t0 = self.last_mark = self.clock.perf_s()
        if self.plan.steps == 0:
            self._end_timed(self.t0)

    def _close(self) -> None:
        self.phase = "done"
        self.end_unix_s = self.clock.unix_s()
        if self.on_close is not None:
            self.on_close(self)

    def cut_short(self) -> None:
        """The script ended inside the timed steps: they end here (what was timed is kept)."""
        if self.phase == "timed":
            self.shape.timed_s = self.last_mark - self.t0
            self.shape.timed_end = "script ended"
            self.shape_timed_steps = len(self.records)

    # ---- after the window ----

    def stop_profiler(self) -> Any:
        """The profiler, stopped (None when the window traced nothing); the caller exports it.
        Where the script ended before the profiler recorded one whole step (inside its warm-up
        step, or the first recorded one) the trace would hold only the script's last moments
        under a step marker, read as a step of the loop: it is dropped, and None returned."""
        profiler, self.profiler = self.profiler, None
        if self._counting():  # the script ended inside the counted step: leave its modes
            self._stop_counting(whole=False)
        if profiler is not None:
            profiler.stop()
            if self.phase == "traced" and self.traced_whole() == 0:
                return None
        return profiler

    def traced_whole(self) -> int:
        """Steps the profiler recorded whole (its warm-up step is not recorded)."""
        return traced_whole(self.records, self.plan.profile_steps)

    def read_back(self) -> list[float | None]:
        """The losses as numbers (one host sync for all steps, after the window: the loop itself
        never waited for them); the records gain their CUDA-event times and losses, the runtime
        facts the optimizer's, the number of optimizers that stepped and CUDA memory. A loss
        that cannot be read is left out (None), never the window."""
        values = [_number(loss) for loss in self.losses]
        for record, gpu_ms in zip(self.records, self.gpu.step_ms()):
            record.gpu_ms = gpu_ms
        for record in self.records:
            record.loss = values[record.index - self.first_index]
        runtime = self.facts.runtime
        runtime.update(gpu.optimizer_facts(self.facts.optimizer))
        runtime["optimizers"] = len(self.facts.optimizer_ids)
        opened = self.switched_at_open
        if opened is not None:  # what the fixes' switches did in the window
            runtime["switched"] = {
                key: count - opened.get(key, 0) for key, count in switches.SWITCHED.items()
            }
        if runtime.get("cuda_used"):
            runtime["cuda_memory"] = self.gpu.memory()
        elif runtime.get("flops_per_step"):  # a CPU has no datasheet peak: measure this one's
            runtime["cpu_peak"] = measure_cpu_peak_facts(runtime.get("flops_by_dtype", {}))
        compiled = compile_facts()  # torch.compile's own records ({} where it never ran)
        if compiled:
            runtime["compile"] = compiled | self.pool.facts()
        return [*([None] * self.first_index), *values]


def _number(loss: torch.Tensor | None) -> float | None:
    if loss is None:
        return None
    try:
        return float(loss.float().item())
    except RuntimeError:  # a device error surfacing here: the loss is unknown, the steps stay
        return None
