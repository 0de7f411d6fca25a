"""Text in report.md, which people paste into pull-request comments: what a script, an exception,
a trace's file name or a rule file says is shown as text on GitHub, never as HTML, links,
emphasis, headings, a mention that notifies someone, or a broken table or code block; its
control characters and bidirectional overrides are shown as escapes (`visible`, report.html's
too). `backtick spans` in trainadvisor's own messages stay code."""

from __future__ import annotations

import re
import shlex

# Characters with a meaning in GitHub Markdown inline text (HTML, entities, emphasis, links,
# images, strikethrough, autolinks); CommonMark lets a backslash escape any of them.
_SPECIAL = re.compile(r"([\\*_\[\]<>&~!|#`])")
# Every line break: CommonMark ends a line at a bare CR too (a heading or a table row could
# start after one), and Python's str.splitlines at these others.
_SPACES = re.compile(r"\s*(?:\r\n|[\r\n\v\f\x1c-\x1e\x85\u2028\u2029])\s*")
# What a terminal or a browser acts on rather than shows: C0 and C1 controls but tab, LF and CR
# (ESC starts a terminal's sequence), DEL, and the bidirectional marks, embeddings,
# overrides and isolates (U+202E shows the rest of a line reversed: "Trojan Source").
_INVISIBLE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
# GitHub links `@name` (a notification) and `#12` (a back-reference in that issue) after the
# Markdown is rendered, so a backslash cannot stop it; a zero-width space after the sign does.
_REFERENCE = re.compile(r"(@|\\#(?=\d))")
_ZERO_WIDTH_SPACE = "&#8203;"


def _one_line(text: str) -> str:
    return _SPACES.sub(" ", str(text)).strip()


def visible(text: str) -> str:
    """`text` with each control character and bidirectional mark shown as its Python escape
    (`\\x1b`, `\\u202e`) instead of acting on what follows it."""
    return _INVISIBLE.sub(lambda m: m[0].encode("unicode_escape").decode("ascii"), text)


def terminal(text: str) -> str:
    """A line for the terminal: `visible`, and a carriage return shown as `\\r` too (it would
    let the rest of a line print over trainadvisor's own words). Object keys, trace file names
    and a script's exception reach the terminal through here: a window title, an OSC 8 link or
    an OSC 52 clipboard write in them is shown, not acted on."""
    return visible(text).replace("\r", "\\r")


def finalized(value: object) -> object:
    """What a report's template prints: text made `visible`, of its own type (HTML already
    escaped stays so: the escapes add no markup)."""
    if isinstance(value, str):
        shown = visible(value)
        return shown if type(value) is str else type(value)(shown)
    return value


def _escaped(text: str) -> str:
    return _REFERENCE.sub(rf"\1{_ZERO_WIDTH_SPACE}", _SPECIAL.sub(r"\\\1", text))


def spans(text: str) -> list[tuple[str, bool]]:
    """The parts of `text` between its backticks, each with whether it is a code span; the
    whole text as one plain part when a backtick is unpaired (report.md and report.html)."""
    parts = text.split("`")
    if len(parts) % 2 == 0:
        return [(text, False)]
    return [(part, i % 2 == 1) for i, part in enumerate(parts)]


def inline(text: object, cell: bool = False) -> str:
    """`text` as Markdown showing exactly it, on one line. Paired backticks stay code spans
    (their content is shown as written, pipes escaped in a table `cell`); an unpaired one is
    shown as a backtick."""
    if text is None:
        return ""
    shown = visible(_one_line(str(text)))
    return "".join(code(p, cell) if is_code else _escaped(p) for p, is_code in spans(shown))


def cell(text: object) -> str:
    return inline(text, cell=True)


_CONTROL = re.compile("[\x00-\x1f\x7f]")


def shell_line(args: list[str]) -> str:
    """A command as one line that bash or zsh reads back as the same arguments: shlex's
    quoting, and `$'...'` with escapes for an argument that holds a newline or another control
    character (shlex leaves those raw; Markdown then folds a newline into a space, and the
    pasted command passes another argument)."""
    return " ".join(_ansi_c(arg) if _CONTROL.search(arg) else shlex.quote(arg) for arg in args)


def _ansi_c(arg: str) -> str:
    named = {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\t": "\\t", "\r": "\\r"}
    shown = "".join(named.get(c) or (f"\\x{ord(c):02x}" if _CONTROL.match(c) else c) for c in arg)
    return f"$'{shown}'"


def code(text: object, cell: bool = False) -> str:
    """`text` as one code span, whatever backticks it holds (a longer delimiter)."""
    text = visible(_one_line(str(text))) if text is not None else ""
    if cell:
        text = text.replace("|", "\\|")
    if not text:
        return ""
    ticks = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def fence(text: object) -> str:
    """The backtick fence for a code block holding `text`: longer than any run of backticks in
    it, so a user's code cannot end the block early."""
    longest = max((len(run) for run in re.findall("`{3,}", str(text))), default=0)
    return "`" * max(3, longest + 1)
