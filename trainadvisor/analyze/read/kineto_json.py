"""What Kineto writes that JSON has not: C++'s `inf`, `-inf`, `nan` for an undefined number
(pytorch/kineto#105), JavaScript's NaN and Infinity, and names escaped as found (half of a
surrogate pair, `"\\ud800"`), which msgspec rejects; Python's json reads NaN and Infinity and
keeps a lone surrogate, which no report could then write. `stream` takes this slower path only
where msgspec stopped on such a spelling."""

from __future__ import annotations

import json
import re
from typing import Any

_AT_BYTE = re.compile(r"\(byte (\d+)\)")
LONE_SURROGATE_HINT = re.compile(rb"\\u[dD][89a-fA-F]")  # a surrogate escape, paired or not
_STRING = re.compile(r'("[^"\\]*(?:\\.[^"\\]*)*")')  # captured: a split keeps the strings
_SURROGATE_ESCAPE = re.compile(r"(\\+)u([dD][89a-fA-F][0-9a-fA-F]{2})(\\u[dD][c-fC-F][0-9a-fA-F]{2})?")


def kineto_spelling(raw: bytes, message: str) -> bool:
    """Whether msgspec stopped on a word for a number (`inf`, `NaN`) or a lone surrogate
    escape (some of which it calls "truncated": the chunk must then hold one), not on a wrong
    cut."""
    if "surrogate" in message:
        return True
    at = _AT_BYTE.search(message)
    if at is not None:
        byte = int(at.group(1))
        # a bare `nan` is read as a `null` gone wrong: msgspec names the byte where `null` would
        # have ended, up to three past the `n`
        return raw[byte : byte + 1] in (b"i", b"I", b"n", b"N") or b"nan" in raw[max(0, byte - 4) : byte + 1]
    return "truncated" in message and LONE_SURROGATE_HINT.search(raw) is not None


def kineto_json(text: str) -> str:
    """`text` with C's `inf`, `-inf`, `nan`, `-nan` spelled as Python's json reads them
    (Infinity, NaN) and lone surrogate escapes replaced by U+FFFD; strings are otherwise kept
    as written. The text outside strings, and the strings, are each rewritten as one text
    joined by NUL (which JSON has nowhere unescaped), so that the work is done in C, not in
    Python per string."""
    if "\x00" in text:
        return text  # no JSON: left to fail as it is
    parts = _STRING.split(text)  # outside, string, outside, ..., outside
    # Outside strings, JSON's only words are true, false and null: the words replaced are whole.
    outside = "\x00".join(parts[0::2]).replace("Infinity", "inf").replace("NaN", "nan")
    outside = outside.replace("-nan", "nan").replace("inf", "Infinity").replace("nan", "NaN")
    parts[0::2] = outside.split("\x00")
    if "\\u" in text:
        parts[1::2] = _SURROGATE_ESCAPE.sub(_paired_or_replaced, "\x00".join(parts[1::2])).split("\x00")
    return "".join(parts)


def _paired_or_replaced(found: re.Match[str]) -> str:
    backslashes, first, low = found.groups()
    if len(backslashes) % 2 == 0:  # an escaped backslash, then the text `ud800`: no escape
        return f"{backslashes}u{first}" + ("\\ufffd" if low else "")
    if low and first[1] in "89abAB":  # a high surrogate, then a low one: a pair
        return found.group(0)
    return backslashes[:-1] + "\\ufffd" + ("\\ufffd" if low else "")


def lenient_loads(raw: bytes) -> Any:
    """The JSON document `raw`, spelled as Kineto writes it (`kineto_json`). Python's json reads
    a lone surrogate escape and keeps it: a document that may hold one takes Kineto's path."""
    if LONE_SURROGATE_HINT.search(raw) is None:
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            pass
    return json.loads(kineto_json(raw.decode("utf-8", "replace")))
