"""What e2e/test_trace_steps.py and integration/test_trace_steps.py share."""

from __future__ import annotations

from conftest import DATA

OWN = DATA / "traces"
