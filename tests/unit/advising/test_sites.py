"""Where a DataLoader that `@advise` first meets as an iterator was built (`advising.sites`):
the user's code is a file written in tmp_path and run in this process, each of its loaders
iterated with num_workers=0 (no worker process), and the line found is the assignment that
built the loader the iterator serves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from trainadvisor.advising.sites import FRAMES, built_at, loader_of
from trainadvisor.records import LoaderInfo

# The user's script. Line numbers matter: the tests name the lines the loaders are built on.
TRAIN = """\
import torch
from torch.utils.data import DataLoader, TensorDataset


def main(find):
    val_loader = DataLoader(TensorDataset(torch.zeros(4)), batch_size=2)
    data = TensorDataset(torch.arange(12.0))
    train_loader = DataLoader(data, batch_size=4)
    return find(iter(train_loader))


class Trainer:
    def __init__(self, data):
        self.batches = DataLoader(data, batch_size=2, shuffle=True)

    def fit(self, find):
        return find(iter(self.batches))


def make_loader():
    return DataLoader(TensorDataset(torch.arange(5.0)), batch_size=5, drop_last=True)


eval_loader = make_loader()


def evaluate(find):
    return find(iter(eval_loader))


def first(find):
    loader = DataLoader(TensorDataset(torch.arange(2.0)))
    return find(iter(loader))


def second(find):
    loader = DataLoader(TensorDataset(torch.arange(3.0)))
    return find(iter(loader))


def held_in_a_list(find):
    loaders = [DataLoader(TensorDataset(torch.arange(3.0)))]
    return find(iter(loaders[0]))


def deep(levels, find, iterator):
    return find(iterator) if levels == 0 else deep(levels - 1, find, iterator)


def nested(levels, find):
    nested_loader = DataLoader(TensorDataset(torch.arange(4.0)))
    return deep(levels, find, iter(nested_loader))
"""


def _script(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """train.py written in tmp_path and run as a module of this process: its functions' code
    names the file, as a script's does."""
    path = tmp_path / "train.py"
    path.write_text(TRAIN)
    namespace: dict[str, Any] = {"__name__": "train"}
    exec(compile(TRAIN, str(path), "exec"), namespace)
    return path, namespace


def test_a_local_loader_is_found_at_its_assignment_and_another_datasets_loader_is_not_taken(
    tmp_path: Path,
) -> None:
    path, script = _script(tmp_path)
    assert script["main"](built_at) == f"{path}:8"  # train_loader, not val_loader (line 6)


def test_a_loader_held_by_self_is_found_at_the_assignment_before_the_iterating_method(
    tmp_path: Path,
) -> None:
    path, script = _script(tmp_path)
    trainer = script["Trainer"](TensorDataset(torch.arange(6.0)))
    assert trainer.fit(built_at) == f"{path}:14"  # no assignment after fit's line: the file's first


def test_a_global_built_by_a_function_named_like_a_loader_is_found(tmp_path: Path) -> None:
    path, script = _script(tmp_path)
    assert script["evaluate"](built_at) == f"{path}:24"


def test_of_two_assignments_to_one_name_the_first_at_or_after_the_function_is_chosen(tmp_path: Path) -> None:
    path, script = _script(tmp_path)
    assert script["first"](built_at) == f"{path}:32"
    assert script["second"](built_at) == f"{path}:37"


def test_a_loader_held_under_no_name_of_its_own_has_no_site(tmp_path: Path) -> None:
    _, script = _script(tmp_path)
    assert script["held_in_a_list"](built_at) is None


def test_only_the_users_innermost_frames_are_searched(tmp_path: Path) -> None:
    """`deep` recurses `levels` times before asking: the frame holding the loader is the
    (levels + 2)-th of the user's, found only within the first FRAMES."""
    path, script = _script(tmp_path)
    assert FRAMES == 8
    assert script["nested"](FRAMES - 2, built_at) == f"{path}:51"
    assert script["nested"](FRAMES - 1, built_at) is None


def test_an_iterator_of_no_dataloader_has_no_site() -> None:
    assert built_at(iter([1, 2, 3])) is None


def test_a_new_loader_is_described_from_its_iterator_with_the_line_that_built_it(tmp_path: Path) -> None:
    path, script = _script(tmp_path)
    known = [LoaderInfo(0, "elsewhere.py:1", "TensorDataset", False, 4, 0, False, False, None, None, None)]
    info = script["main"](lambda iterator: loader_of(iterator, known))
    assert info is not known[0]
    assert (info.index, info.created_at, info.dataset_class, info.iterable_dataset) == (
        1,
        f"{path}:8",
        "TensorDataset",
        False,
    )
    assert (info.batch_size, info.num_workers, info.pin_memory, info.persistent_workers) == (
        4,
        0,
        False,
        False,
    )
    assert (info.prefetch_factor, info.collate_fn, info.batches_in_window) == (None, None, 0)


def test_the_next_epoch_of_a_known_loader_is_that_loader_and_another_dataset_at_its_line_is_new(
    tmp_path: Path,
) -> None:
    path, script = _script(tmp_path)
    data, other = TensorDataset(torch.arange(6.0)), TensorDataset(torch.arange(8.0))
    trainer = script["Trainer"](data)
    known: list[LoaderInfo] = []
    first = trainer.fit(lambda iterator: loader_of(iterator, known))
    assert (first.index, first.created_at, first.dataset_id) == (0, f"{path}:14", id(data))
    assert first.batch_size == 2
    known.append(first)
    assert trainer.fit(lambda iterator: loader_of(iterator, known)) is first
    again = script["Trainer"](other).fit(lambda iterator: loader_of(iterator, known))
    assert (again.index, again.created_at, again.dataset_id) == (1, f"{path}:14", id(other))


# A class's loader attribute and a later function's local of the same name.
SAME_NAME = """\
from torch.utils.data import DataLoader


class Trainer:
    def __init__(self, data):
        self.loader = DataLoader(data)

    def fit(self, find):
        return find(iter(self.loader))


def evaluate(data):
    loader = DataLoader(data)
    return list(loader)
"""


def test_a_loader_held_by_self_is_not_taken_for_a_later_local_of_the_same_name(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    path.write_text(SAME_NAME)
    namespace: dict[str, Any] = {"__name__": "train"}
    exec(compile(SAME_NAME, str(path), "exec"), namespace)
    trainer = namespace["Trainer"](TensorDataset(torch.arange(4.0)))
    assert trainer.fit(built_at) == f"{path}:6"  # self.loader = ..., not evaluate()'s local


def test_a_loader_whose_line_is_not_found_keeps_unknown_as_its_site(tmp_path: Path) -> None:
    _, script = _script(tmp_path)
    info = script["held_in_a_list"](lambda iterator: loader_of(iterator, []))
    assert (info.index, info.created_at, info.batch_size) == (0, "unknown", 1)


def test_a_loader_in_this_tests_own_frame_is_found_in_this_file() -> None:
    dataset = TensorDataset(torch.arange(4.0))
    here_loader = DataLoader(dataset, batch_size=2)
    line = here_loader_line()
    assert built_at(iter(here_loader)) == f"{__file__}:{line}"


def here_loader_line() -> int:
    """The line of `here_loader = DataLoader(...)` in this file, read from its text."""
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if text.strip().startswith("here_loader = DataLoader("))
