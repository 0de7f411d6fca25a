"""Credentials kept out of the reports people attach to pull requests: the value of a script
argument whose name looks like a credential (`--hf-token hf_...`, `--wandb-key=...`,
`api_key=...`) is shown as `***` wherever a report repeats the command line."""

from __future__ import annotations

import re

MASK = "***"
# Words of an argument's name that mark its value as a credential.
_WORDS = {
    "token",
    "key",
    "apikey",
    "secret",
    "password",
    "passwd",
    "pwd",
    "credential",
    "credentials",
    "auth",
}
_SPLIT = re.compile(r"[^a-z0-9]+")


def looks_secret(name: str) -> bool:
    """Whether an argument's name (`--hf-token`, `WANDB_API_KEY`, `db.password`) names a
    credential: one of its words is token, key, secret, password, credential or auth."""
    words = [w for w in _SPLIT.split(name.lower()) if w]
    return any(w in _WORDS or w.endswith("token") for w in words)


def mask_arguments(args: list[str]) -> tuple[list[str], list[str]]:
    """`args` with credential values masked, and the names of the arguments masked."""
    shown: list[str] = []
    masked: list[str] = []
    expecting: str | None = None  # a credential option whose value is the next argument
    for arg in args:
        if expecting is not None:
            shown.append(MASK)
            masked.append(expecting)
            expecting = None
            continue
        name, equals, _ = arg.partition("=")
        if equals and looks_secret(name):
            shown.append(f"{name}={MASK}")
            masked.append(name)
        elif arg.startswith("-") and not equals and looks_secret(arg):
            shown.append(arg)
            expecting = arg
        else:
            shown.append(arg)
    return shown, masked


def masked_note(masked: list[str]) -> str | None:
    """What the report says when it masked something."""
    if not masked:
        return None
    names = ", ".join(dict.fromkeys(masked))
    return (
        f"The values of {names} look like credentials and are shown as {MASK} in this report; "
        "fill them in to run the command again."
    )
