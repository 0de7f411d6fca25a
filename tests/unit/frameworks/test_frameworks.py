"""Advice in the user's framework: real runs of the Hugging Face Trainer and Lightning examples
(a slow dataset each), the settings objects recorded in the script's process, and the changes
written as the framework's settings (the GPU fixes from recorded facts, as the rule cases do)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.frameworks import LIGHTNING, _line

from trainadvisor import rulebook
from trainadvisor.frameworks.change import fix_change
from trainadvisor.records import FrameworkCall, LoaderInfo, Overrides, RawRun
from trainadvisor.training.hooks import Patches

transformers = pytest.importorskip("transformers")


def _lightning_run(**settings: Any) -> RawRun:
    site = f"{LIGHTNING}:{_line(LIGHTNING, 'return DataLoader(')}"
    loader = LoaderInfo(0, site, "SlowVectors", False, 32, 0, False, False, None, "fork", None, 20)
    settings = {"precision": "32-true", "accumulate_grad_batches": 1, **settings}
    call = FrameworkCall(
        "lightning", "Trainer", f"{LIGHTNING}:{_line(LIGHTNING, 'L.Trainer(')}", settings=settings
    )
    return RawRun(
        "baseline", "window_complete", 0, None, 5, 20, 10, 35, [], [loader], None, frameworks=[call]
    )


def test_lightning_precision_and_accumulation_are_trainer_arguments() -> None:
    run = _lightning_run()
    amp = fix_change(LIGHTNING, "amp", Overrides(runtime={"amp": "bf16"}), run)
    assert (
        amp.setting
        == f'`Trainer(precision="bf16-mixed")` at lightning_slow_data.py:{_line(LIGHTNING, "L.Trainer(")}'
    )
    assert '         enable_model_summary=False,\n+        precision="bf16-mixed",\n' in amp.diff
    site = run.loaders[0].created_at
    accumulate = Overrides(loaders={site: {"batch_size": 16}}, runtime={"grad_accumulation": 2})
    change = fix_change(LIGHTNING, "grad-accumulation", accumulate, run)
    assert "+        accumulate_grad_batches=2,\n" in change.diff  # the Trainer's argument
    assert (
        "-            batch_size=self.batch_size,\n+            batch_size=16,\n" in change.diff
    )  # the loader's
    benchmark = fix_change(LIGHTNING, "cudnn-benchmark", Overrides(runtime={"cudnn_benchmark": True}), run)
    assert "+        benchmark=True,\n" in benchmark.diff
    tf32 = fix_change(LIGHTNING, "tf32", Overrides(runtime={"tf32": True}), run)
    assert '+torch.set_float32_matmul_precision("high")\n' in tf32.diff and "allow_tf32" not in tf32.diff
    # already at the setting: nothing to change
    assert (
        fix_change(
            LIGHTNING, "amp", Overrides(runtime={"amp": "bf16"}), _lightning_run(precision="bf16-mixed")
        ).diff
        == ""
    )


def test_rules_advise_in_the_framework_of_the_loop() -> None:
    facts = {
        "cuda_used": True, "has_tensor_cores": True, "fp32_matmul_pct": 70.0, "gpu_name": "NVIDIA H100",
        "alloc_retries": 3, "ooms": 0, "peak_reserved_pct": 97.0, "reserved_unused_pct": 12.0,
        "memory_limit_source": "device total",
    }  # fmt: skip
    rules = rulebook.rules_for([])
    for framework, precision, accumulation in (
        ("lightning", 'precision="bf16-mixed"', "accumulate_grad_batches=4"),
        ("transformers", "bf16=True", "gradient_accumulation_steps=4"),
        ("accelerate", 'mixed_precision="bf16"', "gradient_accumulation_steps=4"),
    ):
        findings = {f.rule: f for f in rulebook.evaluate(rules, {**facts, "framework": framework})}
        assert precision in findings["no-mixed-precision"].best_practice, framework
        assert accumulation in findings["memory-pressure"].best_practice, framework
    generic = {f.rule: f for f in rulebook.evaluate(rules, facts)}
    assert "torch.autocast" in generic["no-mixed-precision"].best_practice


def test_a_rule_names_only_known_frameworks(tmp_path: Path) -> None:
    text = (Path(rulebook.rules_dir()) / "cudnn-benchmark.toml").read_text()
    (tmp_path / "cudnn-benchmark.toml").write_text(text + '\n[recommendation.keras]\nbest_practice = "x"\n')
    with pytest.raises(
        rulebook.RuleError, match=r"\[recommendation.keras\]: advice is for one of transformers"
    ):
        rulebook.load_rule(tmp_path / "cudnn-benchmark.toml")


@pytest.mark.parametrize(
    ("source", "config", "expected"),
    [
        (
            "json",
            "/x/args.json",
            'set `"dataloader_num_workers": 4, "dataloader_persistent_workers": true` in args.json',
        ),
        (
            "yaml",
            "/x/args.yaml",
            "set `dataloader_num_workers: 4, dataloader_persistent_workers: true` in args.yaml",
        ),
        (
            "dict",
            "",
            "set `dataloader_num_workers=4, dataloader_persistent_workers=True` in the dict given to",
        ),
    ],
)
def test_config_files_get_keys(tmp_path: Path, source: str, config: str, expected: str) -> None:
    script = tmp_path / "train.py"
    script.write_text("print()\n")
    trainer_site = "/venv/site-packages/transformers/trainer.py:1051"
    loader = LoaderInfo(
        0, trainer_site, "D", False, 16, 0, True, False, None, "fork", None, 20, framework="transformers"
    )
    current = {"dataloader_num_workers": 0, "dataloader_pin_memory": True}
    call = FrameworkCall(
        "transformers",
        "TrainingArguments",
        f"{script}:3",
        source=source,
        config_file=config,
        settings=current,
    )
    run = RawRun("b", "window_complete", 0, None, 5, 20, 10, 35, [], [loader], None, frameworks=[call])
    wanted = Overrides({trainer_site: {"num_workers": 4, "persistent_workers": True, "pin_memory": True}})
    change = fix_change(script, "dataloader-workers", wanted, run)
    assert change.setting.startswith(expected) and change.diff == ""  # pin_memory: already on


class _Recorder(Patches):
    def __init__(self) -> None:
        super().__init__()
        self.framework_calls: list[FrameworkCall] = []


def test_settings_objects_are_recorded_where_the_user_built_them(tmp_path: Path) -> None:
    from trainadvisor.frameworks import watch

    recorder = _Recorder()
    watch.install(recorder)
    try:
        transformers.TrainingArguments(output_dir=str(tmp_path), dataloader_num_workers=2)
        line = _line_of("transformers.TrainingArguments(output_dir=str(tmp_path), dataloader_num_workers=2)")
        config = tmp_path / "args.json"
        config.write_text(json.dumps({"output_dir": str(tmp_path), "bf16": False}))
        transformers.HfArgumentParser(transformers.TrainingArguments).parse_json_file(json_file=str(config))
    finally:
        recorder.undo()
    first, second = recorder.framework_calls
    assert (first.site, first.source, first.settings["dataloader_num_workers"]) == (
        f"{__file__}:{line}",
        "code",
        2,
    )
    assert (second.source, second.config_file) == ("json", str(config))
    assert transformers.TrainingArguments.__dict__["__post_init__"].__name__ == "__post_init__"  # undone


def _line_of(text: str) -> int:
    return next(
        i
        for i, line in enumerate(Path(__file__).read_text().splitlines(), 1)
        if text in line and "_line_of" not in line
    )
