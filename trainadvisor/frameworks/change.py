"""The change that makes a kept fix permanent, where the user makes it: a diff of the script
(the framework's settings call, the user's own DataLoader, statements after the imports), and
the setting in words, naming the command-line flags or config keys to set when the values
come from there (HfArgumentParser, LightningCLI) instead of a diff."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import libcst as cst

from trainadvisor.fixes import codechange
from trainadvisor.frameworks import framework_of, vocab
from trainadvisor.records import FrameworkCall, Overrides, RawRun

_UNEDITABLE = (OSError, UnicodeDecodeError, cst.ParserSyntaxError, codechange.NoPlace)
# TrainingArguments that DataLoader refuses without workers, at their off values
_WORKER_ONLY_OFF = {"dataloader_persistent_workers": False, "dataloader_prefetch_factor": None}


@dataclass
class Change:
    diff: str = ""  # unified diff of the user's files ("" when there is no single place)
    setting: str = ""  # the framework setting in words ("" when the fix is not a framework's)


def _file_and_line(site: str) -> tuple[Path, int] | None:
    file, _, line = site.rpartition(":")
    return (Path(file), int(line)) if file and line.isdigit() else None


def _editable(site: str, script: Path) -> Path | None:
    """The user's file a call site is in, when it is the script or beside it (never a package's)."""
    place = _file_and_line(site)
    if place is None or framework_of(str(place[0])):
        return None
    path, folder = place[0].resolve(), script.resolve().parent
    return path if path.is_file() and (path == script.resolve() or folder in path.parents) else None


def _where(site: str, script: Path) -> str:
    place = _file_and_line(site)
    if place is None:
        return "where the script builds it"
    path, line = place
    try:
        shown = path.resolve().relative_to(script.resolve().parent)
    except ValueError:
        shown = Path(path.name)
    return f"{shown}:{line}"


def setting_words(call: FrameworkCall, settings: dict[str, Any], script: Path) -> str:
    """Where the user sets these values: the call's arguments, flags, or config-file keys."""
    where = _where(call.site, script)
    arguments = ", ".join(f"{name}={codechange.literal(value)}" for name, value in settings.items())
    if call.source == "command line":
        return (
            f"pass `{vocab.flags(settings)}` on the command line ({call.name} is read by "
            f"HfArgumentParser at {where})"
        )
    if call.source in ("json", "yaml"):
        name = Path(call.config_file).name or f"the {call.source.upper()} file"
        return f"set `{vocab.keys(settings, call.source)}` in {name} ({call.name} is read from it at {where})"
    if call.source == "dict":
        return f"set `{arguments}` in the dict given to HfArgumentParser.parse_dict at {where}"
    if call.source == "lightning cli":
        return (
            f"pass `{vocab.flags(settings, '--trainer.')}` (or set them under `trainer:` in the "
            f"LightningCLI config file; the Trainer is built at {where})"
        )
    return f"`{call.name}({arguments})` at {where}"


def fix_change(script: Path, fix_id: str, overrides: Overrides, raw: RawRun | None) -> Change:
    """The change that makes `overrides` (a kept or recommended fix's) permanent."""
    t = vocab.translate(overrides, raw) if raw is not None else None
    if t is None:
        from trainadvisor.fixes import REGISTRY

        loop = REGISTRY[fix_id].loop_change(overrides) if fix_id in REGISTRY else ""
        return Change(_diff({script: _generic(script, fix_id, overrides)}), loop)
    edits: dict[Path, tuple[str, str] | None] = {}
    words: list[str] = []
    current = t.call.settings
    settings = {k: v for k, v in t.settings.items() if current.get(k, object()) != v}
    if settings.get("dataloader_num_workers") == 0:  # no workers: what needs them goes too
        settings.update({k: off for k, off in _WORKER_ONLY_OFF.items() if current.get(k)})
    if settings:
        words.append(setting_words(t.call, settings, script))
        path = _editable(t.call.site, script) if t.call.source == "code" else None
        if path is not None:
            edits[path] = _call_change(path, t.call, settings)
    rest = t.rest
    if rest.loaders or rest.runtime or rest.non_blocking_h2d or t.lines:
        edits[script] = _own_change(script, _current(edits, script), fix_id, rest, t.lines)
    words += t.notes
    return Change(_diff(edits), "; ".join(words))


def _current(edits: dict[Path, tuple[str, str] | None], script: Path) -> str | None:
    """The script's text as edited so far (None when it is not edited yet)."""
    done = edits.get(script)
    return done[1] if done is not None else None


def _edit(
    path: Path, change: Callable[[str], str | None], source: str | None = None
) -> tuple[str, str] | None:
    """(the file as it is, as `change` makes it from `source`, the file's text by default);
    None when the file cannot be read or parsed, has no safe place, or stays the same."""
    try:
        before = path.read_text()
        after = change(before if source is None else source)
    except _UNEDITABLE:
        return None
    return (before, after) if after is not None and after != before else None


def _call_change(path: Path, call: FrameworkCall, settings: dict[str, Any]) -> tuple[str, str] | None:
    place = _file_and_line(call.site)
    line = place[1] if place else None
    return _edit(path, lambda source: codechange.edit_calls(source, {call.name}, line, settings))


def _own_change(
    script: Path, source: str | None, fix_id: str, overrides: Overrides, lines: list[str]
) -> tuple[str, str] | None:
    """The fix's change of the user's own code, left after the framework's settings: its
    DataLoader, its loop's copies, the switches the framework has no setting for, statements
    after the imports."""
    from trainadvisor.fixes import REGISTRY

    def change(edited: str | None) -> str | None:
        if overrides.loaders or overrides.non_blocking_h2d:
            own = Overrides(overrides.loaders, overrides.non_blocking_h2d)
            edited = codechange.loader_change(edited, script, own) if edited is not None else None
        if overrides.runtime and edited is not None:
            edited = REGISTRY[fix_id].code_change(edited, script, Overrides(runtime=overrides.runtime))
        return codechange.after_imports(edited, lines) if lines and edited is not None else edited

    return _edit(script, change, source)


def _generic(script: Path, fix_id: str, overrides: Overrides) -> tuple[str, str] | None:
    """A loop the user wrote: the fix's own code change of the script."""
    from trainadvisor.fixes import REGISTRY

    return _edit(script, lambda source: REGISTRY[fix_id].code_change(source, script, overrides))


def _diff(edits: dict[Path, tuple[str, str] | None]) -> str:
    return "".join(codechange.unified_diff(path, *edit) for path, edit in edits.items() if edit is not None)
