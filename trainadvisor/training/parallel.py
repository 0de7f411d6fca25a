"""The data-parallel wrappers a script builds, seen as it builds them: `nn.DataParallel` over
several GPUs (counted) and `DistributedDataParallel` (each with the line that built it). At the
window, DDP's own record of itself (`_get_ddp_logging_data`: its buckets, whether it searches
for unused parameters and how many bytes of them went unused) becomes the window's facts
(`ddp_*`): the `ddp-settings` rule and fix read them. FSDP's units (FSDP2's `fully_shard`
modules, FSDP1's wrappers) are found at the window among the live objects, and only where the
script imported FSDP itself (importing it costs 2 s): `fsdp_*`."""

from __future__ import annotations

import gc
import sys
import weakref
from collections.abc import Iterable
from typing import Any

import torch

from trainadvisor.training.loaders import call_site


class Wrappers:
    """The wrappers built in this process so far (the modules themselves held weakly)."""

    def __init__(self) -> None:
        self.data_parallel = 0  # nn.DataParallel modules over two GPUs or more
        self.ddp: list[tuple[weakref.ref[Any], str]] = []  # (the DDP module, where it was built)
        self.no_sync_used = False  # the script enters DDP's no_sync() itself

    def ddp_facts(self) -> dict[str, Any]:
        """The window's facts of the first DDP wrapper still alive (a script builds one), and
        how many were built; nothing where none was."""
        alive = [(module, where) for ref, where in self.ddp if (module := ref()) is not None]
        if not alive:
            return {}
        module, where = alive[0]
        facts: dict[str, Any] = {"ddp_modules": len(alive), "ddp_call_site": where}
        try:
            logged = dict(module._get_ddp_logging_data())
        except Exception:  # noqa: BLE001 - an older torch, a wrapper torn down: no record, no harm
            logged = {}
        find_unused = logged.get("find_unused_parameters", getattr(module, "find_unused_parameters", None))
        facts["ddp_find_unused_parameters"] = None if find_unused is None else bool(find_unused)
        if find_unused and logged.get("unused_parameter_size") is not None:
            facts["ddp_unused_parameter_bytes"] = int(logged["unused_parameter_size"])
        cap_bytes = logged.get("bucket_cap_bytes")
        facts["ddp_bucket_cap_mb"] = cap_bytes / 2**20 if cap_bytes else None
        view = logged.get("gradient_as_bucket_view", getattr(module, "gradient_as_bucket_view", None))
        facts["ddp_gradient_as_bucket_view"] = None if view is None else bool(view)
        facts["ddp_static_graph"] = bool(getattr(module, "static_graph", False))
        facts["ddp_no_sync_used"] = self.no_sync_used
        world = logged.get("world_size")
        facts["ddp_world_size"] = int(world) if world else None
        return {k: v for k, v in facts.items() if v is not None}


def watch(recorder: Any, wrappers: Wrappers) -> None:
    """Count DataParallel modules over several GPUs, and note each DDP module and its line."""
    original_dp_init = torch.nn.DataParallel.__init__

    def data_parallel_init(self: torch.nn.DataParallel, *args: Any, **kwargs: Any) -> None:
        original_dp_init(self, *args, **kwargs)
        if len(getattr(self, "device_ids", None) or []) >= 2:  # one device: DataParallel does nothing
            wrappers.data_parallel += 1

    recorder.patch(torch.nn.DataParallel, "__init__", data_parallel_init)
    ddp = torch.nn.parallel.DistributedDataParallel
    original_ddp_init = ddp.__init__

    def ddp_init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_ddp_init(self, *args, **kwargs)
        wrappers.ddp.append((weakref.ref(self), call_site()))

    recorder.patch(ddp, "__init__", ddp_init)
    original_no_sync = ddp.no_sync

    def no_sync(self: Any) -> Any:
        wrappers.no_sync_used = True
        return original_no_sync(self)

    recorder.patch(ddp, "no_sync", no_sync)


def fsdp_facts(among: Iterable[Any] | None = None) -> dict[str, Any]:
    """FSDP's units alive at the window (or those `among` some objects: a model's modules):
    FSDP2 (`fully_shard`) or FSDP1, how many, how many reshard their parameters after forward
    (FSDP2), over how many ranks; nothing where the script did not import FSDP or started no
    process group (torch.compile imports FSDP too). Read by the objects' own types (`type()`,
    never `isinstance`, which may run a lazy object's code), and never at the cost of the run: a
    failure here is no facts."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    if fsdp is None or not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return {}
    try:
        return _fsdp_units(fsdp, gc.get_objects() if among is None else among)
    except Exception:  # noqa: BLE001 - facts are optional; the training is not
        return {}


def _fsdp_units(fsdp: Any, objects: Iterable[Any]) -> dict[str, Any]:
    two, one = getattr(fsdp, "FSDPModule", None), getattr(fsdp, "FullyShardedDataParallel", None)
    kinds = tuple(kind for kind in (two, one) if kind is not None)
    units = [o for o in objects if issubclass(type(o), kinds)]
    if not units:
        return {}
    fsdp2 = [u for u in units if two is not None and issubclass(type(u), two)]
    facts: dict[str, Any] = {"fsdp_version": "FSDP2" if fsdp2 else "FSDP1", "fsdp_units": len(fsdp2 or units)}
    groups = [_param_group(u) for u in fsdp2]
    resharding = [g for g in groups if g is not None and g.post_forward_mesh_info is not None]
    facts["fsdp_resharding_units"] = len(resharding)
    dtypes = {str(_param_dtype(g)).removeprefix("torch.") for g in groups if _param_dtype(g) is not None}
    if dtypes:  # the script's own MixedPrecisionPolicy: the dtype it gathers parameters in
        facts["fsdp_param_dtype"] = ", ".join(sorted(dtypes))
    if any(_own_policy(g) for g in groups):  # one that sets only reduce_dtype, say
        facts["fsdp_mp_policy_set"] = True
    sizes = {g.mesh_info.mesh.size() for g in groups if g is not None}
    facts["fsdp_world_size"] = max(sizes) if sizes else torch.distributed.get_world_size()
    return facts


def _param_group(unit: Any) -> Any:
    """An FSDP2 unit's parameter group (None for a unit that holds no parameters of its own,
    or a torch whose internals differ)."""
    try:
        return unit._get_fsdp_state()._fsdp_param_group
    except (AttributeError, RuntimeError):
        return None


def _param_dtype(group: Any) -> Any:
    """The dtype an FSDP2 group gathers its parameters in, where its policy sets one."""
    return getattr(getattr(group, "mp_policy", None), "param_dtype", None) if group is not None else None


def _own_policy(group: Any) -> bool:
    """Whether an FSDP2 group's MixedPrecisionPolicy is the script's (any field not the default)."""
    policy = getattr(group, "mp_policy", None) if group is not None else None
    try:
        return policy is not None and policy != type(policy)()
    except TypeError:  # a torch whose policy takes arguments: unknown, so not the script's
        return False
