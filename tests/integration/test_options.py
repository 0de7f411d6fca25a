"""The option table (`options.table`): each option of each command is defined once, and every
place that holds options (click's parameters, `ProfileOptions`, what each run and the user's
process receive, the command that repeats a run) holds exactly the table's."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import click
import pytest

from trainadvisor.cli import main
from trainadvisor.measure.config import ChildConfig
from trainadvisor.measure.spec import RunSpec
from trainadvisor.options import table
from trainadvisor.profile.runs import (
    RUN_OPTIONS,
    ProfileOptions,
    options_from,
    reproduce_command,
    size_for,
    spec_for,
)
from trainadvisor.records import Overrides

# A value other than the default for each field of `profile`'s options record: an option added
# to the table without one here fails `test_the_repeated_command_parses_back_to_the_same_options`.
EXAMPLES: dict[str, Any] = {
    "warmup": 7,
    "steps": 33,
    "min_time_s": 2.5,
    "max_warmup_s": 90.0,
    "memory_budget_bytes": 24 * 10**9,
    "max_workers": 6,
    "out_dir": Path("my report"),
    "rule_dirs": [Path("."), Path("tests")],
    "run_to_end": True,
    "apply_fixes": False,
    "seed": 11,
    "timeout_s": 300.0,
    "stall_s": 45.5,
    "budget_s": 600.0,
    "only_fixes": ["dataloader-workers", "amp"],
    "trials": "restart",
    "output_format": "sarif",
    "workload": "mnist-mlp",
    "log_to": ["mlflow", "tensorboard"],
}
LAUNCHER = {
    "nproc_per_node": 4,
    "nnodes": "2",
    "node_rank": 1,
    "rdzv_endpoint": "10.0.0.1:29400",
    "rdzv_backend": "c10d",
    "rdzv_id": "job-7",
    "master_addr": "10.0.0.1",
    "master_port": 29500,
}


def _commands(group: click.Group, prefix: str = "") -> dict[str, click.Command]:
    """Every command a user runs, by its name ("compare", "baseline save")."""
    found: dict[str, click.Command] = {}
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            found.update(_commands(command, f"{prefix}{name} "))
        else:
            found[prefix + name] = command
    return found


def test_every_command_has_exactly_its_tables_options_in_the_tables_order() -> None:
    commands = _commands(main)
    assert set(commands) == set(table.TABLES)
    for name, options in table.TABLES.items():
        command = commands[name]
        given = [p.name for p in command.params if isinstance(p, click.Option) and p.name != "help"]
        assert given == [o.dest for o in options], name


def test_the_options_record_holds_each_option_once_with_the_tables_default() -> None:
    fields = {f.name for f in dataclasses.fields(ProfileOptions)}
    held = {o.record_field: o for o in table.record_options()}
    assert fields - set(held) == {"script", "args", "torchrun", "stage_dir"}
    assert set(held) <= fields
    record = ProfileOptions(Path("train.py"), [], Path("trainadvisor-report"))
    for name, option in held.items():
        expected = [] if option.multiple else option.default
        assert getattr(record, name) == (Path(expected) if name == "out_dir" else expected), name


def test_what_click_parses_by_default_is_the_records_default() -> None:
    parsed = main.commands["profile"].make_context("profile", ["train.py"]).params
    assert options_from(parsed) == ProfileOptions(Path("train.py"), [], Path("trainadvisor-report"))


def test_the_repeated_command_parses_back_to_the_same_options() -> None:
    assert set(EXAMPLES) == {o.record_field for o in table.record_options()}, "give the new option an example"
    torchrun = table.torchrun_argv(LAUNCHER)
    record = ProfileOptions(Path("train.py"), ["--lr", "0.1"], torchrun=torchrun, **EXAMPLES)
    command = reproduce_command(record)
    assert command[:2] == ["trainadvisor", "profile"]
    parsed = main.commands["profile"].make_context("profile", command[2:]).params
    assert options_from(parsed) == record
    assert torchrun[:2] == ["--nproc-per-node", "4"] and "--master-port" in torchrun


def test_the_repeated_command_spells_out_the_window_folder_and_seed_first_then_what_changed() -> None:
    record = ProfileOptions(Path("train.py"), [], Path("out"))
    assert reproduce_command(record) == [
        "trainadvisor", "profile", "--warmup", "5", "--steps", "20", "--out", "out", "--seed", "0",
        "train.py",
    ]  # fmt: skip
    budgeted = dataclasses.replace(record, budget_s=90.0, min_time_s=0.5, apply_fixes=False)
    assert reproduce_command(budgeted)[6:] == [
        "--out", "out", "--seed", "0", "--min-time", "0.5s", "--no-fix", "--budget", "90s", "train.py",
    ]  # fmt: skip


@pytest.mark.parametrize("name", table.receiving("run"))
def test_an_option_each_run_receives_reaches_its_run_spec(name: str) -> None:
    assert name in RUN_OPTIONS and name in {f.name for f in dataclasses.fields(RunSpec)}
    record = dataclasses.replace(ProfileOptions(Path("train.py"), [], Path("out")), **{name: EXAMPLES[name]})
    assert getattr(spec_for(record, "baseline"), name) == EXAMPLES[name]


def test_options_the_users_process_receives_are_fields_of_its_config() -> None:
    assert set(table.receiving("child")) <= {f.name for f in dataclasses.fields(ChildConfig)}
    assert set(table.receiving("child")) <= set(table.receiving("run"))  # the child gets them through a run


@pytest.mark.parametrize("name", table.receiving("window"))
def test_an_option_of_the_windows_size_changes_it(name: str) -> None:
    base = ProfileOptions(Path("train.py"), [], Path("out"))
    changed = dataclasses.replace(base, **{name: EXAMPLES[name]})
    assert size_for(changed, Overrides()) != size_for(base, Overrides())


def test_every_run_option_is_a_record_field_or_the_script_itself() -> None:
    fields = {f.name for f in dataclasses.fields(ProfileOptions)}
    assert set(RUN_OPTIONS) <= fields
    assert set(RUN_OPTIONS) - set(table.receiving("run")) == {"script", "args", "out_dir", "torchrun"}


def test_torchrun_alone_on_one_node_is_standalone_and_nothing_given_is_no_torchrun() -> None:
    assert table.torchrun_argv({"nproc_per_node": 2}) == ["--nproc-per-node", "2", "--standalone"]
    assert table.torchrun_argv({name: None for name in LAUNCHER}) == []
    assert table.torchrun_argv({"nnodes": "2"})[:2] == ["--nproc-per-node", "1"]
