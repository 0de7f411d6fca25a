"""What e2e/test_energy.py and integration/test_energy.py share."""

from __future__ import annotations

from typing import Any


def _device(uuid: str, **fields: Any) -> dict[str, Any]:
    readings = {"util": 90, "used": 1e9, "total": 8e10, "power_mw": 250000, "sm_clock": 1980}
    return {"uuid": uuid, **readings, **fields}
