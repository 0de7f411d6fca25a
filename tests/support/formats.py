"""What e2e/test_formats.py and integration/test_formats.py share."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
from conftest import DATA

SARIF_SCHEMA = json.loads((DATA / "sarif" / "sarif-schema-2.1.0.json").read_text())


def _sarif_problems(log: dict[str, Any]) -> list[str]:
    return [e.message for e in jsonschema.Draft7Validator(SARIF_SCHEMA).iter_errors(log)]
