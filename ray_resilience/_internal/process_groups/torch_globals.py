"""torch.distributed module globals that pin an old attempt's process group, and their release.

Measured on torch 2.13 (2 ranks, gloo, FSDP2 + AdamW): after ``destroy_process_group()`` and
``gc.collect()`` an attempt's group could stay alive with its gloo device (listener, epoll, wakeup
pipe), its TCPStore connection (5 descriptors on a non-host rank; on rank 0 also the store server)
and its threads. Two different holders, both module globals:

1. Default arguments bound at import time. ``torch.distributed.nn.functional`` declares
   ``def all_reduce(tensor, op=..., group=group.WORLD)`` and friends. ``group.WORLD`` is ``None``
   before ``init_process_group`` and the default group after it, so when that module is first
   imported during an attempt (``from torch.distributed.fsdp import fully_shard`` inside the train
   function pulls it in through ``torch.distributed._shard``), the attempt's group is pinned in
   ``__defaults__`` for the life of the process. ProcessGroup objects are not tracked by the
   garbage collector (and a tuple holding only such objects is untracked too), so
   ``gc.get_referrers`` cannot see this holder: it was found by bisecting imports.
2. DTensor's caches keyed by ``DeviceMesh``/``DTensorSpec``: ``_redistribute._planner_cache``
   (a weak-reference key, but the cached planner holds the mesh strongly), ``functools`` caches
   such as ``_redistribute._gen_transform_infos``, ``MeshTopoInfo.build_from_mesh`` and
   ``ShardingPropagator._propagate_tensor_meta_cached``, and the C++ dispatch fast-path cache. A
   ``DeviceMesh`` equals another with the same ranks, layout and creating thread id, so a new
   attempt either hits the old entry (the old mesh stays, cached specs point at it) or, when its
   training thread got another id, adds one more: hence "one old mesh every few restarts".

``release_attempt_globals`` resets such defaults to ``None`` (what a pre-init import gives) and
empties the caches (performance caches, refilled within a step). It walks the modules instead of
naming entries, so a holder of the same kind added by a torch upgrade is released too. DTensor's
Python propagation cache is a ``threading.local``: the training thread's copy dies with that
thread, which is one reason the worker runs each attempt in a fresh thread and joins it first.
"""

from __future__ import annotations

import functools
import sys
import types
from collections.abc import Iterator

from torch.distributed import ProcessGroup

_MODULE_PREFIX = "torch.distributed."
_LRU_CACHE_TYPE = functools._lru_cache_wrapper  # what @lru_cache and @cache return
_NAMED_CLEARERS = (
    # planner objects hold their mesh strongly, under a weak-reference key
    "torch.distributed.tensor._redistribute.clear_redistribute_planner_cache",
    # the C++ DTensor dispatch fast path keeps DTensorSpecs (and their meshes), per thread
    "torch._C._clear_DTensor_sharding_propagator_cache",
)


def release_attempt_globals() -> list[str]:
    """Drops every module-level reference torch.distributed keeps to groups and meshes.

    Call after all process groups are destroyed. Returns the qualified names released. Touches
    members with ``type()`` only, never ``getattr``/``isinstance``: some module members are lazy
    proxies that warn when probed.
    """
    released: list[str] = []
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(_MODULE_PREFIX):
            continue
        for owner, attr, value in _module_members(module):
            if type(value) in (staticmethod, classmethod):
                value = value.__func__
            if type(value) is _LRU_CACHE_TYPE:
                value.cache_clear()
                released.append(f"{owner}.{attr}")
            elif type(value) is types.FunctionType and _reset_group_defaults(value):
                released.append(f"{owner}.{attr} (default group argument)")
    return released + _call_named_clearers() + _clear_this_threads_propagator_cache()


def _reset_group_defaults(func: types.FunctionType) -> bool:
    """Replaces ProcessGroup default values with None; True if any was found."""
    changed = False
    if func.__defaults__ and any(_is_group(d) for d in func.__defaults__):
        func.__defaults__ = tuple(None if _is_group(d) else d for d in func.__defaults__)
        changed = True
    if func.__kwdefaults__ and any(_is_group(d) for d in func.__kwdefaults__.values()):
        func.__kwdefaults__ = {k: None if _is_group(d) else d
                               for k, d in func.__kwdefaults__.items()}
        changed = True
    return changed


def _is_group(value: object) -> bool:
    return issubclass(type(value), ProcessGroup)


def _call_named_clearers() -> list[str]:
    released = []
    for qualname in _NAMED_CLEARERS:
        module_name, _, func_name = qualname.rpartition(".")
        clear = getattr(sys.modules.get(module_name), func_name, None)
        if clear is not None:
            clear()
            released.append(qualname)
    return released


def _clear_this_threads_propagator_cache() -> list[str]:
    """DTensor's Python sharding cache for the calling thread (the only one reachable)."""
    dtensor_cls = getattr(sys.modules.get("torch.distributed.tensor._api"), "DTensor", None)
    dispatcher = getattr(dtensor_cls, "_op_dispatcher", None)
    cache = getattr(getattr(dispatcher, "sharding_propagator", None), "propagate_op_sharding", None)
    if cache is None or not callable(getattr(cache, "cache_clear", None)):
        return []
    cache.cache_clear()
    return ["DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding (this thread)"]


def _module_members(module: types.ModuleType) -> Iterator[tuple[str, str, object]]:
    """(owner name, attribute, value) for a module's globals and its own classes' attributes."""
    for attr, value in list(vars(module).items()):
        yield module.__name__, attr, value
        if issubclass(type(value), type) and vars(value).get("__module__") == module.__name__:
            for cls_attr, cls_value in list(vars(value).items()):
                yield f"{module.__name__}.{value.__qualname__}", cls_attr, cls_value
