"""What e2e/test_hostile.py and unit/test_hostile.py share."""

from __future__ import annotations

TOKEN = "hf_FAKEtoken0123456789abcdef"


KEY = "wandbFAKEkey98765"
