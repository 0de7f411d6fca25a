"""Faults and untrusted input (issue 16, in part): credentials kept out of reports, one run at a
time per report folder."""

from __future__ import annotations

import json
from pathlib import Path

from support.hostile import KEY, TOKEN

from trainadvisor.redact import Secrets, looks_secret, mask_arguments


def test_credential_like_arguments_are_masked() -> None:
    args = [
        "--hf-token",
        TOKEN,
        "--lr",
        "0.1",
        f"--wandb-key={KEY}",
        "db.password=pw",
        "--keep",
        "3",
        "--monkey",
        "x",
    ]
    shown, masked = mask_arguments(args)
    assert shown == [
        "--hf-token", "***", "--lr", "0.1", "--wandb-key=***", "db.password=***", "--keep", "3",
        "--monkey", "x",
    ]  # fmt: skip
    assert masked == ["--hf-token", "--wandb-key", "db.password"]
    names = ("AWS_SECRET_ACCESS_KEY", "--api-key", "--authtoken", "--keys-file")
    assert [looks_secret(n) for n in names] == [True, True, True, False]


def test_a_short_credential_masks_the_strings_of_a_result_file_not_its_bytes(tmp_path: Path) -> None:
    """`--token 5`, `--use_auth_token true`, `--api-secret warmup`: masked byte by byte, the
    result file's numbers and literals became `***` (invalid JSON: an internal error, no report).
    Its string values are masked instead; a short value that is the whole of a string and reads
    as a word of code is one of trainadvisor's own words as often as the credential."""
    result = tmp_path / "baseline.result.json"
    saved = {"steps": [5, 15, 0.5], "exit_code": 5, "ok": True, "status": "warmup",
             "error": "KeyError: 'true' with token 5 (warmup)", "log": "https://u:pw5@host/x"}  # fmt: skip
    result.write_text(json.dumps(saved))
    Secrets(["5", "true", "warmup"]).json_file(result)
    assert json.loads(result.read_text()) == {
        "steps": [5, 15, 0.5], "exit_code": 5, "ok": True, "status": "warmup",
        "error": "KeyError: '***' with token *** (***)", "log": "https://u:***@host/x",
    }  # fmt: skip
    # a short credential that is not one of trainadvisor's own words is masked whole too
    assert Secrets(["hunter2"]).value({"password": "hunter2", "n": 2}) == {"password": "***", "n": 2}
