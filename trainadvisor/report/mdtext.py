"""Text in report.md, which people paste into pull-request comments: what a script, an exception
or a rule file says is shown as text on GitHub, never as HTML, links, emphasis, or a broken
table or code block. `backtick spans` in trainadvisor's own messages stay code."""

from __future__ import annotations

import re

# Characters with a meaning in GitHub Markdown inline text (HTML, entities, emphasis, links,
# images, strikethrough, autolinks); CommonMark lets a backslash escape any of them.
_SPECIAL = re.compile(r"([\\*_\[\]<>&~!|#`])")
_SPACES = re.compile(r"\s*\n\s*")


def _one_line(text: str) -> str:
    return _SPACES.sub(" ", str(text)).strip()


def _escaped(text: str) -> str:
    return _SPECIAL.sub(r"\\\1", text)


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
    return "".join(code(p, cell) if is_code else _escaped(p) for p, is_code in spans(_one_line(str(text))))


def cell(text: object) -> str:
    return inline(text, cell=True)


def code(text: object, cell: bool = False) -> str:
    """`text` as one code span, whatever backticks it holds (a longer delimiter)."""
    text = _one_line(str(text)) if text is not None else ""
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
