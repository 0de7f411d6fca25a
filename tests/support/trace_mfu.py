"""What e2e/test_trace_mfu.py and integration/test_trace_mfu.py share."""

from __future__ import annotations

H100_STACK = "artifacts/trace_memory_flops/h100_residual_stack.pt.trace.json.gz"
