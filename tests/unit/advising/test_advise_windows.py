"""The stand-in loader of an `advise(trials=True)` trial window (`advising.windows.stand_in`): built from
an iterator of the user's in-process DataLoader (num_workers=0) with the settings a trial asks for, over
the loader's own dataset, sampler, collate_fn, worker_init_fn and generator; or, where the workers asked
for could not receive the dataset, the reason why. No loader with workers is iterated here (that would
start processes): only what it was built with is read."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset
from torch.utils.data.dataloader import _BaseDataLoaderIter

from trainadvisor.advising.advisor import _note_built_with
from trainadvisor.advising.windows import stand_in
from trainadvisor.records import LoaderInfo
from trainadvisor.training.loaders import describe_iterator

SAMPLES = torch.arange(20, dtype=torch.float32)


class _Unsendable(Dataset[int]):
    """A dataset that cannot be pickled (it holds an open connection, say)."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, index: int) -> int:
        return index

    def __reduce__(self) -> Any:
        raise TypeError("it holds an open socket")


def _collate(batch: list[tuple[torch.Tensor]]) -> torch.Tensor:
    return torch.stack([sample for (sample,) in batch]) * 10


def _iterator(loader: DataLoader) -> tuple[Any, LoaderInfo]:
    iterator = iter(loader)
    return iterator, describe_iterator(iterator, 0)


def test_workers_asked_for_give_a_loader_over_the_same_dataset_sampler_and_collate_fn() -> None:
    loader = DataLoader(TensorDataset(SAMPLES), batch_size=4, shuffle=True, collate_fn=_collate)
    iterator, info = _iterator(loader)
    built = stand_in(iterator, {"num_workers": 2, "prefetch_factor": 4, "persistent_workers": True}, info)
    assert isinstance(built, DataLoader)
    assert (built.num_workers, built.prefetch_factor, built.persistent_workers) == (2, 4, True)
    assert built.dataset is loader.dataset
    assert built.batch_sampler is loader.batch_sampler  # fresh passes of the loop's own sampler
    assert built.collate_fn is _collate
    assert built.pin_memory is False and built.timeout == 0
    assert loader.num_workers == 0  # the user's loader is left as it was


def test_the_caller_s_loader_info_is_not_changed() -> None:
    loader = DataLoader(TensorDataset(SAMPLES), batch_size=4)
    iterator, info = _iterator(loader)
    info = replace(info, overrides_applied={"num_workers": 1})
    stand_in(iterator, {"num_workers": 2}, info)
    assert info.overrides_applied == {"num_workers": 1}
    assert (info.num_workers, info.override_refused) == (0, None)


def test_worker_settings_without_workers_are_dropped_and_the_batches_are_the_loaders() -> None:
    """prefetch_factor and persistent_workers mean nothing without workers: a loader of 0 workers
    comes back, and it serves what the user's loader serves."""
    loader = DataLoader(TensorDataset(SAMPLES), batch_size=8, collate_fn=_collate)
    iterator, info = _iterator(loader)
    built = stand_in(iterator, {"prefetch_factor": 4, "persistent_workers": True}, info)
    assert isinstance(built, DataLoader)
    assert (built.num_workers, built.prefetch_factor, built.persistent_workers) == (0, None, False)
    batches = [batch.tolist() for batch in built]
    assert batches == [
        [0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0],
        [80.0, 90.0, 100.0, 110.0, 120.0, 130.0, 140.0, 150.0],
        [160.0, 170.0, 180.0, 190.0],
    ]
    assert batches == [batch.tolist() for batch in loader]


def test_pinning_asked_for_without_a_gpu_is_left_out() -> None:
    loader = DataLoader(TensorDataset(SAMPLES), batch_size=4)
    iterator, info = _iterator(loader)
    assert not torch.cuda.is_available()  # the suite hides any GPU (conftest)
    built = stand_in(iterator, {"pin_memory": True, "num_workers": 2}, info)
    assert isinstance(built, DataLoader)
    assert (built.pin_memory, built.num_workers) == (False, 2)


def test_a_loader_without_batching_keeps_its_sampler_and_no_batch_size() -> None:
    loader = DataLoader(TensorDataset(SAMPLES), batch_size=None)
    iterator, info = _iterator(loader)
    built = stand_in(iterator, {"num_workers": 2}, info)
    assert isinstance(built, DataLoader)
    assert built.batch_size is None and built.batch_sampler is None
    assert built.sampler is loader.sampler
    assert built.num_workers == 2


def test_workers_that_could_not_receive_the_dataset_are_refused_with_the_reason() -> None:
    """A loader whose workers would start with spawn (the context a multi-worker loader's iterator
    names; given here to the iterator of a loader of 0 workers, which torch lets have none)."""
    iterator, info = _iterator(DataLoader(_Unsendable(), batch_size=2))
    iterator._multiprocessing_context = "spawn"
    refused = stand_in(iterator, {"num_workers": 2}, info)
    assert refused == (
        "the DataLoader's dataset (_Unsendable) cannot be pickled (TypeError: it holds an open socket), "
        "and worker processes started with 'spawn' need it pickled; define it at module level"
    )
    assert info.override_refused is None  # said to the caller, not written into its info


def test_a_dataset_that_cannot_be_pickled_is_fine_without_workers() -> None:
    iterator, info = _iterator(DataLoader(_Unsendable(), batch_size=2))
    without = stand_in(iterator, {"num_workers": 0, "prefetch_factor": 4}, info)
    assert isinstance(without, DataLoader)
    assert [batch.tolist() for batch in without] == [[0, 1], [2, 3], [4, 5]]


def test_a_dataset_that_cannot_be_pickled_is_fine_for_forked_workers() -> None:
    iterator, info = _iterator(DataLoader(_Unsendable(), batch_size=2))
    iterator._multiprocessing_context = "fork"  # workers forked from this process: nothing pickled
    forked = stand_in(iterator, {"num_workers": 2}, info)
    assert isinstance(forked, DataLoader)
    assert forked.num_workers == 2


def _seed_worker(worker_id: int) -> None:
    torch.manual_seed(worker_id)


def test_a_loader_of_no_workers_gives_the_stand_in_its_worker_init_fn_and_generator() -> None:
    """An iterator of no workers keeps neither: the advisor notes them as each iterator is made,
    so that a trial's workers are seeded as the user's code would seed them."""
    generator = torch.Generator().manual_seed(3)
    before = _BaseDataLoaderIter.__init__
    undo = _note_built_with()
    try:
        loader = DataLoader(
            TensorDataset(SAMPLES), batch_size=4, worker_init_fn=_seed_worker, generator=generator
        )
        iterator, info = _iterator(loader)
    finally:
        undo()
    assert _BaseDataLoaderIter.__init__ is before  # put back
    built = stand_in(iterator, {"num_workers": 2}, info)
    assert isinstance(built, DataLoader)
    assert built.worker_init_fn is _seed_worker and built.generator is generator
    # an iterator made before the advisor noted anything: what the iterator itself keeps (nothing here)
    fresh, fresh_info = _iterator(loader)
    unnoted = stand_in(fresh, {"num_workers": 2}, fresh_info)
    assert isinstance(unnoted, DataLoader)
    assert unnoted.worker_init_fn is None and unnoted.generator is None
