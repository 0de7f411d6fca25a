"""Editing the user's script for a fix's code change (each fix's `code_change` says what to
edit; `frameworks.change` turns it into a unified diff of the user's files).

The source is parsed with libcst (a concrete syntax tree: comments, spacing and layout are kept)
and only the call a fix is about is changed: the `DataLoader(...)` at the call site the run
recorded, or the torch optimizer's constructor; switches that are set once (TF32, cuDNN
autotuning) go after the script's imports; statements that wrap or compile the model go after
the one that builds it (`after_model`). Pure: text in, text out.

Fixes import this module where they write their change, not at their top: the measured run of
the script imports the fixes (their switches) and must not pay for libcst (0.3 s a run)."""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

if TYPE_CHECKING:
    from trainadvisor.records import Overrides

# DataLoader's positional parameters, in order (an argument given by position is replaced there)
_DATALOADER_POSITIONS = (
    "dataset", "batch_size", "shuffle", "sampler", "batch_sampler", "num_workers", "collate_fn",
    "pin_memory", "drop_last", "timeout", "worker_init_fn", "multiprocessing_context", "generator",
)  # fmt: skip


# DataLoader's arguments that need workers, at their defaults (set where a call gives them and
# the fix takes its workers away)
_WORKER_ONLY_OFF = {"persistent_workers": False, "prefetch_factor": None}


def literal(value: Any) -> str:
    """A value as Python source, strings in double quotes (as most code writes them)."""
    return json.dumps(value) if isinstance(value, str) and value.isprintable() else repr(value)


class NoPlace(Exception):
    """The call cannot be changed safely (`**kwargs`, an explicit conflicting argument)."""


def _name(func: cst.BaseExpression) -> str | None:
    if isinstance(func, cst.Name):
        return func.value
    if isinstance(func, cst.Attribute):
        return func.attr.value
    return None


def _with_keywords(
    call: cst.Call,
    keywords: dict[str, Any],
    positions: tuple[str, ...] = (),
    where_given: dict[str, Any] | None = None,
) -> cst.Call:
    """The call with each keyword set: an existing argument's value replaced (by keyword, or by
    position when `positions` names the parameters), a new one added after the last argument (a
    trailing comma, and the line break after it, stay at the end). `where_given`: keywords set
    only where the call already passes them (a default that needs no new argument)."""
    args = list(call.args)
    if any(a.star for a in args):
        raise NoPlace("the call passes *args or **kwargs")
    given = {a.keyword.value for a in args if a.keyword}
    keywords = {**keywords, **{k: v for k, v in (where_given or {}).items() if k in given}}
    positional = [i for i, a in enumerate(args) if a.keyword is None]
    for key, value in keywords.items():
        expression = cst.parse_expression(literal(value))
        index = next((i for i, a in enumerate(args) if a.keyword and a.keyword.value == key), None)
        if index is None and key in positions and positions.index(key) < len(positional):
            index = positional[positions.index(key)]
        if index is not None:
            args[index] = args[index].with_changes(value=expression)
            continue
        new = cst.Arg(
            keyword=cst.Name(key),
            value=expression,
            equal=cst.AssignEqual(
                whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
            ),
        )
        if args:
            new, args[-1] = _after_last(call, args, new)
        args.append(new)
    return call.with_changes(args=args)


def _after_last(call: cst.Call, args: list[cst.Arg], new: cst.Arg) -> tuple[cst.Arg, cst.Arg]:
    """A new argument after the last one, in the call's layout: on a line of its own when the
    arguments are one per line, else after the last on its line. Returns (new, last)."""
    last = args[-1]
    if isinstance(call.whitespace_before_args, cst.ParenthesizedWhitespace):  # one per line
        between = args[-2].comma if len(args) > 1 else cst.MaybeSentinel.DEFAULT
        if not isinstance(between, cst.Comma):
            between = cst.Comma(whitespace_after=call.whitespace_before_args)
        new = new.with_changes(comma=last.comma, whitespace_after_arg=last.whitespace_after_arg)
        return new, last.with_changes(comma=between, whitespace_after_arg=cst.SimpleWhitespace(""))
    if isinstance(last.comma, cst.Comma):  # a trailing comma: it moves to the new argument
        new = new.with_changes(comma=last.comma)
    return new, last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))


class _CallEditor(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(
        self,
        wrapper: MetadataWrapper,
        names: set[str],
        line: int | None,
        keywords: dict[str, Any],
        parameters: tuple[str, ...] = (),
        conflicts: tuple[str, ...] = (),
        where_given: dict[str, Any] | None = None,
    ):
        super().__init__()
        self.positions = wrapper.resolve(PositionProvider)
        self.names, self.line, self.keywords = names, line, keywords
        self.parameters, self.conflicts, self.where_given = parameters, conflicts, where_given
        self.changed = 0

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if _name(original.func) not in self.names:
            return updated
        if self.line is not None:
            span = self.positions[original]
            if not span.start.line <= self.line <= span.end.line:
                return updated
        if any(a.keyword and a.keyword.value in self.conflicts for a in original.args):
            return updated  # e.g. an optimizer built with foreach=...: fused would conflict
        self.changed += 1
        return _with_keywords(updated, self.keywords, self.parameters, self.where_given)


class _BatchCopyEditor(cst.CSTTransformer):
    """`x.to(...)`/`x.cuda(...)` with `non_blocking=True`, where `x` is bound by the target of
    an enclosing `for` loop (`for x, y in loader:`): the batch, not the model."""

    def __init__(self) -> None:
        super().__init__()
        self.targets: list[set[str]] = []
        self.changed = 0

    def visit_For(self, node: cst.For) -> None:
        self.targets.append({n.value for n in _names_in(node.target)})

    def leave_For(self, original: cst.For, updated: cst.For) -> cst.For:
        self.targets.pop()
        return updated

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        func = original.func
        if (
            isinstance(func, cst.Attribute) and func.attr.value in ("to", "cuda")
            and isinstance(func.value, cst.Name) and any(func.value.value in t for t in self.targets)
            and not any(a.keyword and a.keyword.value == "non_blocking" for a in original.args)
            and not _to_host(original)
        ):  # fmt: skip
            self.changed += 1
            return _with_keywords(updated, {"non_blocking": True})
        return updated


def _to_host(call: cst.Call) -> bool:
    """`x.to("cpu")` and the like: a copy to the host must stay blocking (it is read next)."""
    return any(isinstance(a.value, cst.SimpleString) and "cpu" in a.value.value.lower() for a in call.args)


def _names_in(node: cst.CSTNode) -> list[cst.Name]:
    if isinstance(node, cst.Name):
        return [node]
    if isinstance(node, (cst.Tuple, cst.List)):
        return [n for element in node.elements for n in _names_in(element.value)]
    return []


def edit_calls(
    source: str,
    names: set[str],
    line: int | None,
    keywords: dict[str, Any],
    parameters: tuple[str, ...] = (),
    conflicts: tuple[str, ...] = (),
    where_given: dict[str, Any] | None = None,
) -> str | None:
    wrapper = MetadataWrapper(cst.parse_module(source))
    editor = _CallEditor(wrapper, names, line, keywords, parameters, conflicts, where_given)
    changed = wrapper.visit(editor)
    return changed.code if editor.changed else None


def after_imports(source: str, lines: list[str]) -> str:
    """`lines` as statements after the module's last top-level import (with `import torch`
    first when the script has no such line: the statements need the name)."""
    if "import torch\n" not in source:
        lines = ["import torch", *lines]
    module = cst.parse_module(source)
    body = list(module.body)
    last = max(
        (i for i, s in enumerate(body) if isinstance(s, cst.SimpleStatementLine)
         and any(isinstance(x, (cst.Import, cst.ImportFrom)) for x in s.body)),
        default=-1,
    )  # fmt: skip
    new = [cst.parse_statement(line) for line in lines]
    return module.with_changes(body=[*body[: last + 1], *new, *body[last + 1 :]]).code


def unified_diff(path: Path, before: str, after: str) -> str:
    name = path.name
    return "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{name}", f"b/{name}"
        )
    )


def loader_change(source: str, script: Path, overrides: Overrides) -> str | None:
    """The DataLoader(...) calls the overrides name (by call site) with their arguments set, and
    `non_blocking=True` on the loop's copies of its batches when asked; None when a loader is
    built in another file."""
    edited: str | None = source
    for site, keywords in overrides.loaders.items():
        file, _, line = site.rpartition(":")
        if Path(file).resolve() != script.resolve() or not line.isdigit() or edited is None:
            return None  # the DataLoader is built in another file
        # without workers, DataLoader refuses persistent_workers=True and a prefetch_factor
        off = _WORKER_ONLY_OFF if keywords.get("num_workers") == 0 else None
        edited = edit_calls(
            edited, {"DataLoader"}, int(line), keywords, _DATALOADER_POSITIONS, where_given=off
        )
    if edited is not None and overrides.non_blocking_h2d:
        edited = cst.parse_module(edited).visit(_BatchCopyEditor()).code
    return edited


# ---- statements after the one that builds the model (compile, activation checkpointing) ----


def after_model(source: str, lines: Callable[[str], list[str]]) -> str | None:
    """`source` with the statements `lines(name)` after the statement that builds the model:
    the name whose `.parameters()` an optimizer is built from (the statement of the same block
    that last assigns it before that), or, in a Lightning script, the module given to
    `trainer.fit` (just before that call). None where neither is found."""
    editor = _AfterModel(lines)
    changed = cst.parse_module(source).visit(editor)
    return changed.code if editor.done else None


class _AfterModel(cst.CSTTransformer):
    def __init__(self, lines: Callable[[str], list[str]]) -> None:
        super().__init__()
        self.lines, self.done = lines, False

    def leave_Module(self, original: cst.Module, updated: cst.Module) -> cst.Module:
        return updated.with_changes(body=self._edited(list(updated.body)))

    def leave_IndentedBlock(
        self, original: cst.IndentedBlock, updated: cst.IndentedBlock
    ) -> cst.IndentedBlock:
        return updated.with_changes(body=self._edited(list(updated.body)))

    def _edited(self, body: list[Any]) -> list[Any]:
        if self.done:
            return body
        for at, statement in enumerate(body):
            trained = _called_on(statement, "parameters", nested=True)
            if trained is not None:
                where = max((i for i in range(at) if trained in _assigned(body[i])), default=None)
                if where is not None:
                    return self._insert(body, where + 1, trained)
            fitted = _called_on(statement, "fit", nested=False)
            if fitted is not None and any(fitted in _assigned(s) for s in body[:at]):
                return self._insert(body, at, fitted)
        return body

    def _insert(self, body: list[Any], at: int, name: str) -> list[Any]:
        self.done = True
        statements = [cst.parse_statement(line) for line in self.lines(name)]
        return [*body[:at], *statements, *body[at:]]


def after_models(
    source: str, lines: Callable[[str], list[str]], fit_lines: Callable[[str], list[str]]
) -> str | None:
    """`after_model` for every model an optimizer is built from in the first block that builds
    one (a GAN's generator and discriminator, each with its optimizer): `lines(name)` after the
    statement that last assigns each name before its optimizer's; in a Lightning script,
    `fit_lines(name)` before `trainer.fit`. None where none is found."""
    editor = _AfterModels(lines, fit_lines)
    changed = cst.parse_module(source).visit(editor)
    return changed.code if editor.done else None


class _AfterModels(_AfterModel):
    def __init__(self, lines: Callable[[str], list[str]], fit_lines: Callable[[str], list[str]]) -> None:
        super().__init__(fit_lines)  # `_AfterModel`'s own place: before trainer.fit
        self.model_lines = lines

    def _edited(self, body: list[Any]) -> list[Any]:
        if self.done:
            return body
        inserts: dict[int, list[str]] = {}  # the place after a model is built -> its names
        for at, statement in enumerate(body):
            trained = _called_on(statement, "parameters", nested=True)
            if trained is None or any(trained in names for names in inserts.values()):
                continue
            where = max((i for i in range(at) if trained in _assigned(body[i])), default=None)
            if where is not None:
                inserts.setdefault(where + 1, []).append(trained)
        if not inserts:
            return super()._edited(body)  # a Lightning script: before trainer.fit
        self.done = True
        edited = list(body)
        for at in sorted(inserts, reverse=True):
            statements = [
                cst.parse_statement(line) for name in inserts[at] for line in self.model_lines(name)
            ]
            edited[at:at] = statements
        return edited


def _called_on(statement: cst.CSTNode, method: str, nested: bool) -> str | None:
    """The name `X` of the first `X.<method>(...)` call in `statement` (`nested`: only as an
    argument of another call, as `AdamW(model.parameters())`); for `fit`, its first argument."""
    for call in _calls(statement):
        if not isinstance(call.func, cst.Attribute) or call.func.attr.value != method:
            continue
        if method == "fit":
            first = call.args[0].value if call.args else None
            return first.value if isinstance(first, cst.Name) else None
        if isinstance(call.func.value, cst.Name) and (not nested or _inside_call(statement, call)):
            return call.func.value.value
    return None


def _calls(node: cst.CSTNode) -> list[cst.Call]:
    found: list[cst.Call] = []

    class Visitor(cst.CSTVisitor):
        def visit_Call(self, call: cst.Call) -> None:
            found.append(call)

    node.visit(Visitor())
    return found


def _inside_call(statement: cst.CSTNode, inner: cst.Call) -> bool:
    return any(
        inner is not outer and any(inner in _calls(arg) for arg in outer.args) for outer in _calls(statement)
    )


def _assigned(statement: cst.CSTNode) -> set[str]:
    """The names a simple statement assigns (`model = ...`, `model: Net = ...`)."""
    names: set[str] = set()
    if not isinstance(statement, cst.SimpleStatementLine):
        return names
    for small in statement.body:
        targets = (
            [t.target for t in small.targets]
            if isinstance(small, cst.Assign)
            else [small.target]
            if isinstance(small, cst.AnnAssign)
            else []
        )
        names.update(t.value for t in targets if isinstance(t, cst.Name))
    return names
