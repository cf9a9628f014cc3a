"""Pickling what the ranks run, on the driver, with an error that names what did not pickle.

The train function and its config travel to every rank by cloudpickle; a lock or an open file
captured by the function would otherwise fail inside Ray's actor creation, far from its cause.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any

from ray import cloudpickle

from ray_resilience.errors import ConfigError

_FIX = ("Create such objects inside the train function (or pass plain values through "
        "train_loop_config) instead of capturing them.")


def dumps(field: str, value: Any) -> bytes:
    """`cloudpickle.dumps(value)`, or a ConfigError naming the part that cannot be pickled."""
    try:
        return cloudpickle.dumps(value)
    except Exception as exc:  # noqa: BLE001 - any pickling failure gets the same diagnosis
        where, culprit = _find_culprit(field, value)
        raise ConfigError(where, culprit, f"cannot be pickled to ship it to the ranks "
                                          f"({type(exc).__name__}: {exc}). {_FIX}") from None


def _find_culprit(field: str, value: Any, depth: int = 0) -> tuple[str, Any]:
    """The most specific (path, object) below `value` that does not pickle on its own."""
    if depth < 4:
        for path, part in _parts(field, value):
            if not _pickles(part):
                return _find_culprit(path, part, depth + 1)
    return field, value


def _parts(field: str, value: Any) -> Iterator[tuple[str, Any]]:
    """What a function captures (closure variables, globals it names, defaults), a mapping's
    values, a sequence's items or an object's attributes."""
    if inspect.isfunction(value):
        yield from _captured(field, value)
    elif isinstance(value, dict):
        yield from ((f"{field}[{k!r}]", v) for k, v in value.items())
    elif isinstance(value, list | tuple | set | frozenset):
        yield from ((f"{field}[{i}]", v) for i, v in enumerate(value))
    elif hasattr(value, "__dict__") and not isinstance(value, type):
        yield from ((f"{field}.{k}", v) for k, v in vars(value).items())


def _captured(field: str, fn: Callable[..., Any]) -> Iterator[tuple[str, Any]]:
    code = fn.__code__
    for name, cell in zip(code.co_freevars, fn.__closure__ or (), strict=False):
        try:
            yield f"{field}[closure {name!r}]", cell.cell_contents
        except ValueError:  # an empty cell: nothing to pickle
            continue
    for name in code.co_names:
        if name in fn.__globals__ and not inspect.ismodule(fn.__globals__[name]):
            yield f"{field}[global {name!r}]", fn.__globals__[name]
    for i, default in enumerate(fn.__defaults__ or ()):
        yield f"{field}[default {i}]", default


def _pickles(value: Any) -> bool:
    try:
        cloudpickle.dumps(value)
    except Exception:  # noqa: BLE001 - probing: any failure means "not this one"
        return False
    return True
