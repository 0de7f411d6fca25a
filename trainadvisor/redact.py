"""Credentials kept out of the reports people attach to pull requests: the value of a script
argument whose name looks like a credential (`--hf-token hf_...`, `--wandb-key=...`,
`api_key=...`) and the password of a URL (`postgres://user:PASSWORD@host/db`) are shown as
`***` wherever a report repeats the command line (`mask_arguments`), and wherever else the
value turns up (`Secrets`): an exception that quotes it, a log the script printed it to, the
results its process saved.

May import: nothing of the package."""

from __future__ import annotations

import functools
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

MASK = "***"
# Words of an argument's name that mark its value as a credential.
_WORDS = {
    "token",
    "key",
    "apikey",
    "secret",
    "password",
    "passphrase",
    "passwd",
    "pwd",
    "credential",
    "credentials",
    "auth",
}
_SPLIT = re.compile(r"[^a-z0-9]+")


def looks_secret(name: str) -> bool:
    """Whether an argument's name (`--hf-token`, `WANDB_API_KEY`, `db.password`) names a
    credential: one of its words is token, key, secret, password, passphrase, credential or auth."""
    words = [w for w in _SPLIT.split(name.lower()) if w]
    return any(w in _WORDS or w.endswith("token") for w in words)


# A URL's password (`scheme://user:PASSWORD@host`): up to the authority's last `@`, so a
# password with an unescaped `@` in it is masked whole.
_URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/:@]*:)(?P<password>[^\s/]+)(?=@)")
_URL_PASSWORD_BYTES = re.compile(_URL_PASSWORD.pattern.encode())


def _masked_url(text: str) -> str:
    return _URL_PASSWORD.sub(lambda m: m["head"] + MASK, text)


def _masking(args: list[str]) -> tuple[list[str], list[str], list[str]]:
    """`args` with credentials masked, the names of the arguments masked, and the values masked."""
    shown: list[str] = []
    masked: list[str] = []
    values: list[str] = []
    expecting: str | None = None  # a credential option whose value is the next argument
    for i, arg in enumerate(args):
        if expecting is not None:
            shown.append(MASK)
            masked.append(expecting)
            values.append(arg)
            expecting = None
            continue
        name, equals, value = arg.partition("=")
        if equals and looks_secret(name):
            shown.append(f"{name}={MASK}")
            masked.append(name)
            values.append(value)
        elif arg.startswith("-") and not equals and looks_secret(arg):
            shown.append(arg)
            expecting = arg
        elif _URL_PASSWORD.search(arg):
            shown.append(_masked_url(arg))
            option = name if equals and name.startswith("-") else None
            if option is None and i and args[i - 1].startswith("-"):
                option = args[i - 1]
            masked.append(option or shown[-1])
            values += [m["password"] for m in _URL_PASSWORD.finditer(arg)]
        else:
            shown.append(arg)
    return shown, masked, values


def mask_arguments(args: list[str]) -> tuple[list[str], list[str]]:
    """`args` with credential values and URLs' passwords masked, and the names of the arguments
    masked (a URL given alone is named by itself, masked)."""
    shown, masked, _ = _masking(args)
    return shown, masked


# trainadvisor's own words that a result file holds as whole strings (statuses, phases, how a
# warm-up or window ended, what ended a step): a credential equal to one of them is not masked
# where it is the whole string (masked, the record would not read back); anywhere in text it is.
OWN_WORDS = frozenset(
    {
        "window_complete", "script_ended", "script_failed", "refused", "measured", "failed",
        "changed_training", "kept", "recommended", "no_gain", "not_applicable", "unconfirmed",
        "not_run", "needs_restart", "opportunity", "redundant", "inconclusive", "settled", "count",
        "time cap", "settle cap", "step cap", "raced", "plan", "script ended", "optimizer", "backward",
        "warmup", "timed", "traced", "done", "in_process", "restart", "fork", "spawn", "forkserver",
        "cpu", "cuda", "high", "medium", "low", "training", "inference", "step", "window",
    }
)  # fmt: skip
# A value this short is masked only as a word of its own: `--key id` must not turn `valid`
# into `val***` (nor `--token 3` every digit 3 of a log).
_SHORT = 8
_WORD = "A-Za-z0-9"


class Secrets:
    """The credential values of a script's command line (those `mask_arguments` masks), to mask
    wherever they turn up in text trainadvisor writes; URLs' passwords are masked in any text."""

    def __init__(self, values: list[str] | tuple[str, ...] = ()) -> None:
        self.values = tuple(sorted({v for v in values if v and v != MASK}, key=len, reverse=True))
        forms = {v: self._forms(v) for v in self.values}
        parts = [self._pattern(re.escape(f), len(v)) for v, fs in forms.items() for f in fs]
        self._text = re.compile("|".join(parts)) if parts else None
        self._bytes = re.compile("|".join(parts).encode()) if parts else None

    @classmethod
    def of(cls, args: list[str]) -> Secrets:
        return cls(_masking(args)[2])

    @staticmethod
    def _forms(value: str) -> list[str]:
        """The value as written, and as JSON writes it inside a string (a result file)."""
        quoted = {json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1]}
        return sorted({value, *quoted}, key=len, reverse=True)

    @staticmethod
    def _pattern(escaped: str, length: int) -> str:
        return escaped if length >= _SHORT else f"(?<![{_WORD}]){escaped}(?![{_WORD}])"

    def text(self, text: str) -> str:
        """`text` with every credential value and every URL's password shown as `***`."""
        if self._text is not None:
            text = self._text.sub(MASK, text)
        return _masked_url(text) if "://" in text else text

    def data(self, data: bytes) -> bytes:
        """The same for bytes (a log: the script's own output, whatever its encoding)."""
        if self._bytes is not None:
            data = self._bytes.sub(MASK.encode(), data)
        if b"://" in data:
            data = _URL_PASSWORD_BYTES.sub(lambda m: m["head"] + MASK.encode(), data)
        return data

    def value(self, data: Any) -> Any:
        """Parsed JSON data with every string value masked (`text`); numbers, literals and keys as
        they are. A string that is one of trainadvisor's own words whole (`OWN_WORDS`: a status,
        a phase, `--api-secret warmup`) is left: masked, the record would not read back."""
        if isinstance(data, str):
            return data if data in OWN_WORDS else self.text(data)
        if isinstance(data, list):
            return [self.value(item) for item in data]
        if isinstance(data, dict):
            return {key: self.value(item) for key, item in data.items()}
        return data

    def json_file(self, path: Path) -> None:
        """Mask a JSON file trainadvisor's child wrote (its result, its progress): the string
        values of its parsed data (`value`), never its bytes, so that a short credential
        (`--token 5`, `--use_auth_token true`) cannot rewrite the file's numbers or literals
        into invalid JSON. A file that is not JSON (cut short) is masked as text (`file`)."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            self.file(path)
            return
        masked = self.value(data)
        if masked != data:
            content = json.dumps(masked).encode()
            _rewrite(path, functools.partial(_write, content=content))

    def file(self, path: Path) -> None:
        """Mask a file the script's process wrote (its log, its results), line by line, where
        something is to be masked. The file is rewritten in place, not replaced: a report folder
        may hold a hard link to it already (`report.folder` publishes staged logs so). A file
        that cannot be rewritten (a full disk) is left as it was: the run goes on."""
        try:
            with open(path, "rb") as source:
                if not any(self.data(line) != line for line in source):
                    return
        except OSError:
            return

        def stage(staged: Path) -> None:
            with open(path, "rb") as source, open(staged, "wb") as target:
                for line in source:
                    target.write(self.data(line))

        _rewrite(path, stage)


def _write(staged: Path, content: bytes) -> None:
    staged.write_bytes(content)


def _rewrite(path: Path, stage: Callable[[Path], None]) -> None:
    """`path` rewritten in place with what `stage` writes into a file beside it (not replaced:
    a report folder may hold a hard link to it); where that cannot be written whole (a full
    disk), `path` is left as it was."""
    staged = path.with_name(f".{path.name}.masked")
    try:
        stage(staged)
        with open(staged, "rb") as source, open(path, "r+b") as target:
            shutil.copyfileobj(source, target)
            target.truncate()
    except OSError:
        pass
    finally:
        staged.unlink(missing_ok=True)


def masked_note(masked: list[str]) -> str | None:
    """What the report says when it masked something."""
    if not masked:
        return None
    names = ", ".join(dict.fromkeys(masked))
    return (
        f"The values of {names} look like credentials and are shown as {MASK} in this report; "
        "fill them in to run the command again."
    )
