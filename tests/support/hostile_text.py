"""What e2e/test_hostile_text.py and integration/test_hostile_text.py share."""

from __future__ import annotations

TOKEN = "SEKRETvalue123"


PASSWORD = "PASSWORD9"


PHRASE = "open sesame 42"


URL = f"postgres://u:{PASSWORD}@h/db"


ARGS = ["--api-key", TOKEN, "--db", URL, "--passphrase", PHRASE]


SHOWN = ["--api-key", "***", "--db", "postgres://u:***@h/db", "--passphrase", "***"]
