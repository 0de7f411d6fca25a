"""What e2e/test_object_storage.py and integration/test_gzip_pipeline.py share."""

from __future__ import annotations

import numpy as np

from trainadvisor.analyze.read.columns import Table


def same_table(a: Table, b: Table) -> None:
    """The same rows and side tables; names and threads compared as values (their codes follow
    the order each reader met them)."""
    for field, value in vars(a).items():
        other = getattr(b, field)
        if field in ("names", "tids"):
            assert sorted(map(repr, value)) == sorted(map(repr, other)), field
        elif field in ("name", "tid"):
            table = "names" if field == "name" else "tids"
            assert [getattr(a, table)[i] for i in value.tolist()] == [
                getattr(b, table)[i] for i in other.tolist()
            ]
        elif isinstance(value, np.ndarray):
            assert value.dtype == other.dtype and np.array_equal(value, other), field
        else:
            assert value == other, field
