"""In the script's process: each training framework's settings object the script builds, and
which framework built each DataLoader.

The frameworks are not imported here: a finder on `sys.meta_path` patches each watched class
(`frameworks.WATCHED`) when the script (or a framework) imports its module. Recording never
raises into the script: a failure to record loses the record, not the run."""

from __future__ import annotations

import enum
import importlib.abc
import importlib.machinery
import inspect
import os
import sys
from collections.abc import Callable
from types import FrameType, ModuleType
from typing import Any

from trainadvisor.frameworks import WATCHED, Watched, framework_of, ours_or_torch
from trainadvisor.records import FrameworkCall, LoaderInfo

# HfArgumentParser's methods, by where the values they parse come from, and the local that
# names the file they read
_PARSERS = {
    "parse_args_into_dataclasses": ("command line", ""),
    "parse_json_file": ("json", "json_file"),
    "parse_yaml_file": ("yaml", "yaml_file"),
    "parse_dict": ("dict", ""),
}


def _plain(value: Any) -> Any:
    """A setting as JSON keeps it: enums by value, objects by their class name."""
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return type(value).__name__


class _Origin:
    """Where a framework object was built from: the user's frame, and how its values arrived."""

    def __init__(self, framework: str, built: Any) -> None:
        self.site, self.source, self.config_file, self.inside = "unknown", "code", "", ""
        frame: FrameType | None = sys._getframe(2)
        while frame is not None:
            name = frame.f_code.co_filename
            owner = framework_of(name)
            if owner:
                self._framework_frame(frame, owner, framework)
            elif not (
                ours_or_torch(name) or name.startswith("<") or frame.f_locals.get("self") is built
            ):  # the user's frame (not a subclass's own __init__ of the object being built)
                self.site = f"{os.path.abspath(name)}:{frame.f_lineno}"
                return
            frame = frame.f_back

    def _framework_frame(self, frame: FrameType, owner: str, framework: str) -> None:
        if owner != framework:
            self.inside = owner  # e.g. the Accelerator a transformers Trainer builds
            return
        code = frame.f_code
        if code.co_filename.endswith("hf_argparser.py") and code.co_name in _PARSERS:
            self.source, local = _PARSERS[code.co_name]  # the outermost parser call wins
            self.config_file = str(frame.f_locals.get(local, "")) if local else ""
        elif code.co_filename.endswith("cli.py") and framework == "lightning":
            self.source = "lightning cli"  # LightningCLI: --trainer.* flags or its --config file


def record(watched: Watched, built: Any, bound: dict[str, Any]) -> FrameworkCall:
    """The object just built, as a record: its class, the user's call, its settings' values."""
    origin = _Origin(watched.framework, built)
    settings = {}
    for name in watched.settings:
        value = getattr(built, name, bound.get(name)) if not name.startswith("_") else None
        if callable(value):
            value = bound.get(name)
        settings[name] = _plain(value)
    return FrameworkCall(
        framework=watched.framework, name=type(built).__name__, site=origin.site, source=origin.source,
        config_file=origin.config_file, inside=origin.inside, settings=settings,
    )  # fmt: skip


def described(framework: str, built: Any) -> FrameworkCall:
    """A framework's settings object met after it was built (a callback's `args`, `trainer`):
    its settings, from an unknown call."""
    watched = next(w for w in WATCHED if w.framework == framework)
    settings = {name: _plain(getattr(built, name, None)) for name in watched.settings}
    return FrameworkCall(framework=framework, name=type(built).__name__, site="unknown", settings=settings)


def _patch_class(recorder: Any, watched: Watched, module: ModuleType) -> None:
    cls = getattr(module, watched.attribute, None)
    original = cls.__dict__.get(watched.method) if isinstance(cls, type) else None
    if original is None:
        return
    signature = inspect.signature(original)

    def constructed(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        try:
            bound = signature.bind(self, *args, **kwargs)
            bound.apply_defaults()
            recorder.framework_calls.append(record(watched, self, dict(bound.arguments)))
        except Exception:  # a record lost, never the script's object
            pass
        return result

    constructed.__wrapped__ = original  # type: ignore[attr-defined]
    recorder.patch(cls, watched.method, constructed)


class _Then(importlib.abc.Loader):
    """A module's loader, then a callback on the executed module."""

    def __init__(self, loader: Any, then: Callable[[ModuleType], None]) -> None:
        self.loader, self.then = loader, then

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        try:
            self.then(module)
        except Exception:  # the import goes on unwatched
            pass

    def __getattr__(self, name: str) -> Any:  # get_data, resource readers: the real loader's
        return getattr(self.loader, name)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls back once a watched module is imported (the other finders find it)."""

    def __init__(self, callbacks: dict[str, Callable[[ModuleType], None]]) -> None:
        self.callbacks = callbacks

    def find_spec(
        self, fullname: str, path: Any, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        then = self.callbacks.pop(fullname, None)
        if then is None:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if finder is not self and find else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Then(spec.loader, then)
                return spec
        return None


def install(recorder: Any) -> None:
    """Record each watched class built from now on in `recorder.framework_calls`."""
    waiting: dict[str, Callable[[ModuleType], None]] = {}
    for watched in WATCHED:

        def patch(module: ModuleType, watched: Watched = watched) -> None:
            _patch_class(recorder, watched, module)

        if watched.module in sys.modules:
            patch(sys.modules[watched.module])
        else:
            waiting[watched.module] = patch
    finder = _AfterImport(waiting)
    sys.meta_path.insert(0, finder)
    recorder.on_uninstall(lambda: _remove(finder))


def _remove(finder: _AfterImport) -> None:
    if finder in sys.meta_path:
        sys.meta_path.remove(finder)


def loader_origin(loaders: list[LoaderInfo]) -> str:
    """Inside a framework's code building a DataLoader: the call site of a loader it was built
    from (accelerate's prepare() wraps the DataLoader given to it), "" when none is in reach."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if framework_of(name):
            for value in frame.f_locals.values():
                index = getattr(value, "_trainadvisor_loader", None) if _is_loader(value) else None
                if isinstance(index, int) and 0 <= index < len(loaders):
                    return loaders[index].created_at
        elif not ours_or_torch(name):
            return ""  # out of the framework's code: the user's
        frame = frame.f_back
    return ""


def _is_loader(value: Any) -> bool:
    from torch.utils.data import DataLoader

    return isinstance(value, DataLoader)
