"""torch.distributed module globals that pin an old attempt's process group, and their release:
default arguments bound to ``group.WORLD`` at import time, and DTensor caches keyed by meshes
(docs/design.md, section 5).
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
    """Drops every module-level reference torch.distributed keeps to groups and meshes; returns
    their qualified names. Probes members with ``type()`` only: some are lazy proxies that warn."""
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
