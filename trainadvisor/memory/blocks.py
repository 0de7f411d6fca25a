"""The module the optimizers train, found when it is first called, and its repeated blocks: the
ModuleList or Sequential of modules of one type (transformer layers, residual blocks) whose
activations activation checkpointing recomputes instead of keeping.

The trained module is the first module called whose parameters hold `TRAINED_SHARE` of what the
optimizers train (the model, or the wrapper around it, not one of its layers); the hook that
looks for it is removed once it is found. Torch is imported by the functions that need it: the
parent process reads only the facts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# The share of the optimizers' parameters (by count of elements) a module must hold to be the
# one trained: the model, not one of its layers.
TRAINED_SHARE = 0.9


def on_trained_module(recorder: Any, act: Callable[[Any], None]) -> None:
    """Call `act(module)` once, before the first call of the module the optimizers train
    (`recorder.patch` and `recorder.on_uninstall` undo what this installs)."""
    import torch

    trained: dict[int, int] = {}  # id of each parameter an optimizer trains -> its elements
    original_init = torch.optim.Optimizer.__dict__["__init__"]

    def init(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        for group in self.param_groups:
            trained.update({id(p): p.numel() for p in group["params"]})

    recorder.patch(torch.optim.Optimizer, "__init__", init)
    handles = [find_trained(lambda: trained, act)]
    recorder.on_uninstall(lambda: [handle.remove() for handle in handles])


def on_each_trained_module(recorder: Any, act: Callable[[Any], None]) -> None:
    """Call `act(module)` once for each module an optimizer trains, before its first call: the
    first module called that holds TRAINED_SHARE of one optimizer's parameters (a GAN's two
    models, each with its optimizer, are two; one wrapper holding both is one). The hook goes once
    every optimizer built so far has its module."""
    import torch

    optimizers: list[dict[int, int]] = []  # each optimizer's parameter ids -> elements
    served: set[int] = set()  # the optimizers whose module was found
    looked_at: set[int] = set()
    handles: list[Any] = []
    original_init = torch.optim.Optimizer.__dict__["__init__"]

    def init(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        optimizers.append({id(p): p.numel() for group in self.param_groups for p in group["params"]})

    def look(module: torch.nn.Module, _args: Any) -> None:
        if not optimizers or id(module) in looked_at:
            return
        looked_at.add(id(module))
        held = {id(p) for p in module.parameters()}
        mine = [
            i
            for i, params in enumerate(optimizers)
            if i not in served
            and sum(n for p, n in params.items() if p in held) >= TRAINED_SHARE * sum(params.values())
        ]
        if not mine:
            return
        served.update(mine)
        if len(served) == len(optimizers):
            handles[0].remove()
        act(module)

    recorder.patch(torch.optim.Optimizer, "__init__", init)
    handles.append(torch.nn.modules.module.register_module_forward_pre_hook(look))
    recorder.on_uninstall(lambda: handles[0].remove())


def find_trained(trained: Callable[[], dict[int, int]], act: Callable[[Any], None]) -> Any:
    """A global forward pre-hook that calls `act` on the first module called that holds
    TRAINED_SHARE of `trained()` (parameter id -> elements), then removes itself."""
    import torch

    looked_at: set[int] = set()
    handle: Any = None

    def look(module: torch.nn.Module, _args: Any) -> None:
        params = trained()
        if not params or id(module) in looked_at:
            return
        looked_at.add(id(module))
        held = sum(params.get(id(p), 0) for p in module.parameters())
        if held < TRAINED_SHARE * sum(params.values()):
            return
        handle.remove()
        act(module)

    handle = torch.nn.modules.module.register_module_forward_pre_hook(look)
    return handle


def repeated_blocks(model: Any) -> dict[str, Any] | None:
    """The container of repeated blocks holding the most parameters: `blocks_path` (as
    `model.get_submodule` reads it; "" for the model itself), `blocks` (how many),
    `blocks_type` and `blocks_params_pct` (of the model's parameters); None where the model has
    none (two or more modules of one type that have modules of their own and parameters)."""
    import torch

    best: tuple[int, str, Any] | None = None
    for path, container in model.named_modules():
        if not isinstance(container, (torch.nn.ModuleList, torch.nn.Sequential)):
            continue
        children = list(container.children())
        kinds = {type(c) for c in children}
        if len(children) < 2 or len(kinds) != 1 or not all(list(c.children()) for c in children):
            continue
        held = sum(p.numel() for p in container.parameters())
        if held and (best is None or held > best[0]):
            best = (held, path, children)
    if best is None:
        return None
    held, path, children = best
    total = sum(p.numel() for p in model.parameters()) or 1
    return {
        "blocks_path": path,
        "blocks": len(children),
        "blocks_type": type(children[0]).__name__,
        "blocks_params_pct": 100.0 * held / total,
        "hf_gradient_checkpointing": bool(getattr(model, "supports_gradient_checkpointing", False)),
    }


def checkpoint_blocks(model: Any, path: str) -> Callable[[], None]:
    """Each block of `model.get_submodule(path)` recomputed in backward (its forward run
    through torch.utils.checkpoint, non-reentrant, the RNG state kept so dropout draws the
    same); returns what undoes it."""
    import functools

    from torch.utils.checkpoint import checkpoint

    blocks = list(model.get_submodule(path).children())
    for block in blocks:
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)

    def undo() -> None:
        for block in blocks:
            block.__dict__.pop("forward", None)

    return undo
