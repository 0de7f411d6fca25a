"""After a script died of out-of-memory (`profile.rescue`): which deaths count as out-of-memory,
how a fix's trials turn into its outcome (the first run that got through its window recommended,
with its figures and its code change; a last run that died of out-of-memory again failed), and
the note that says how the fixes were judged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainadvisor.profile.rescue import WHY_RESTART, died_of_oom, note, rescued
from trainadvisor.records import FixOutcome, Overrides, RawRun, RunStatus, Trial, TrialStatus

MiB, GiB = 2**20, 2**30
OOM = {
    "kind": "cuda", "request_bytes": 128 * MiB, "live_bytes": 3 * GiB, "limit_bytes": 4 * GiB,
    "limit_source": "device total",
}  # fmt: skip
FOREACH_OFF = Overrides(runtime={"optimizer_foreach_off": True})
SCRIPT = (
    "import torch\n\nmodel = torch.nn.Linear(4, 4)\n"
    "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)\n"
)


def _raw(status: RunStatus = "window_complete", runtime: dict[str, Any] | None = None) -> RawRun:
    return RawRun("run", status, 0, None, 5, 20, 0, 40, [], [], None, runtime=runtime or {})


def _trial(
    label: str, status: TrialStatus, steps_per_s: float | None = None, runtime: dict[str, Any] | None = None
) -> Trial:
    raw = _raw("window_complete" if status == "measured" else "script_failed", runtime)
    return Trial(
        label, FOREACH_OFF if label == "foreach=False" else Overrides(), status, steps_per_s, None, raw=raw
    )


def _outcome(trials: list[Trial]) -> FixOutcome:
    """A memory fix's outcome before the rescue judged it, with a gain from its trials."""
    return FixOutcome(
        "optimizer-foreach", "out-of-memory", "no_gain", "no candidate was faster", Overrides(), trials,
        gain=1.2, gain_low=0.9,
    )  # fmt: skip


def _script(tmp_path: Path) -> Path:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    return script


def test_only_a_failed_run_with_an_out_of_memory_error_died_of_it() -> None:
    assert died_of_oom(_raw("script_failed", {"oom": OOM}))
    assert not died_of_oom(_raw("script_failed", {"oom": {}}))
    assert not died_of_oom(_raw("script_failed"))
    # an out-of-memory error the script caught and survived: the run got through
    assert not died_of_oom(_raw("window_complete", {"oom": OOM}))
    assert not died_of_oom(_raw("script_ended", {"oom": OOM}))


def test_the_first_run_that_got_through_is_recommended_with_its_figures_and_code_change(
    tmp_path: Path,
) -> None:
    trials = [
        _trial("foreach=True", "failed", runtime={"oom": OOM}),
        _trial("foreach=False", "measured", 12.34, {"cuda_memory": {"peak_reserved_bytes": 2_414_000_000}}),
        _trial("later", "measured", 20.0),
    ]
    outcome = rescued(_outcome(trials), _script(tmp_path), _raw("script_failed", {"oom": OOM}))
    assert (outcome.status, outcome.chosen, outcome.settings) == ("recommended", "foreach=False", FOREACH_OFF)
    assert outcome.reason == (
        "without it the script died of out-of-memory; with it the run got through its window: "
        "12.3 steps/s, peak reserved 2.41 GB"
    )
    assert (outcome.gain, outcome.gain_low) == (None, None)  # no speed of its own to compare with
    assert outcome.diff == (
        "--- a/train.py\n+++ b/train.py\n@@ -1,4 +1,4 @@\n import torch\n \n model = torch.nn.Linear(4, 4)\n"
        "-optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)\n"
        "+optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)\n"
    )
    assert outcome.setting_change == ""
    assert outcome.trials == trials


def test_without_the_allocators_peak_the_counted_steps_peak_is_given(tmp_path: Path) -> None:
    trials = [_trial("foreach=False", "measured", None, {"memory": {"peak_bytes": 1_500_000_000}})]
    outcome = rescued(_outcome(trials), _script(tmp_path), _raw("script_failed", {"oom": OOM}))
    assert outcome.reason == (
        "without it the script died of out-of-memory; with it the run got through its window: "
        "peak of one step 1.50 GB"
    )


def test_a_run_that_got_through_without_figures_is_recommended_without_them(tmp_path: Path) -> None:
    outcome = rescued(
        _outcome([_trial("foreach=False", "measured")]),
        _script(tmp_path),
        _raw("script_failed", {"oom": OOM}),
    )
    assert outcome.status == "recommended"
    assert (
        outcome.reason
        == "without it the script died of out-of-memory; with it the run got through its window"
    )


def test_a_fix_whose_last_run_died_of_out_of_memory_again_failed_with_what_the_allocator_had(
    tmp_path: Path,
) -> None:
    trials = [_trial("foreach=True", "failed"), _trial("foreach=False", "failed", runtime={"oom": OOM})]
    outcome = rescued(_outcome(trials), _script(tmp_path), _raw("script_failed", {"oom": OOM}))
    assert (outcome.status, outcome.settings, outcome.chosen, outcome.diff) == ("failed", Overrides(), "", "")
    assert outcome.reason == (
        "foreach=False: it died of out-of-memory again (it asked for 128.00 MiB more with 3.00 GiB already "
        "allocated, of the 4.00 GiB it may use (device total))"
    )
    assert (outcome.gain, outcome.gain_low) == (1.2, 0.9)


def test_a_fix_whose_last_run_failed_otherwise_keeps_its_own_outcome(tmp_path: Path) -> None:
    original = _outcome(
        [_trial("foreach=True", "failed", runtime={"oom": OOM}), _trial("foreach=False", "refused")]
    )
    assert rescued(original, _script(tmp_path), _raw("script_failed", {"oom": OOM})) is original
    no_run = _outcome([Trial("foreach=False", FOREACH_OFF, "failed", None, "it did not start", raw=None)])
    assert rescued(no_run, _script(tmp_path), _raw("script_failed", {"oom": OOM})) is no_run


def test_a_fix_without_trials_is_left_as_it_was(tmp_path: Path) -> None:
    original = _outcome([])
    assert rescued(original, _script(tmp_path), _raw("script_failed", {"oom": OOM})) is original


def test_the_note_says_no_fix_applied_when_none_was_tried() -> None:
    assert (
        note([])
        == "The script died of out-of-memory; no fix it proposes applies to this run (each says why)."
    )
    assert note([_outcome([])]) == note([])


def test_the_note_says_how_tried_fixes_were_judged() -> None:
    assert note([_outcome([]), _outcome([_trial("foreach=False", "measured")])]) == (
        "The script died of out-of-memory, so there is no speed of its own to compare a fix with: "
        "each fix was tried in fresh runs of the script, and one whose run got through its window "
        "is recommended with that run's figures (not confirmed in a further run)."
    )
    assert WHY_RESTART == "the script died of out-of-memory: each candidate runs it afresh"
