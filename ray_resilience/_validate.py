"""Shared checks for the configs' fields: each raises `ConfigError` naming the field, the value
(and for a wrong type, the type given and the type expected) and the fix.

Numbers must be finite: a NaN passes every `<` comparison, so a NaN timeout would silently turn
hang detection off. Bools are not numbers here, and numbers are not bools.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from typing import Any

from ray_resilience.errors import ConfigError


def _type_names(expected: type | tuple[type, ...]) -> str:
    kinds = expected if isinstance(expected, tuple) else (expected,)
    return " or ".join(k.__name__ for k in kinds)


def wrong_type(field: str, value: Any, expected: str, fix: str = "") -> ConfigError:
    """The error for a value of the wrong type: names the type given and the one expected."""
    given = type(value).__name__
    article = "an" if given[0].lower() in "aeiou" else "a"
    return ConfigError(field, value, f"got {article} {given}, expected {expected}."
                                     + (f" {fix}" if fix else ""))


def number(field: str, value: Any, *, minimum: float | None = None, above: float | None = None,
           fix: str = "") -> float:
    """A finite real number (not a bool), `>= minimum` and/or `> above`; returns it as float."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise wrong_type(field, value, "a number", fix)
    if not math.isfinite(value):
        raise ConfigError(field, value, "must be a finite number (NaN and infinity turn the "
                                        "check it drives off)." + (f" {fix}" if fix else ""))
    if minimum is not None and value < minimum:
        raise ConfigError(field, value, f"must be >= {minimum}." + (f" {fix}" if fix else ""))
    if above is not None and value <= above:
        raise ConfigError(field, value, f"must be > {above}." + (f" {fix}" if fix else ""))
    return float(value)


def seconds(field: str, value: Any, *, minimum: float | None = None, fix: str = "") -> float:
    """A finite duration in seconds, > 0 (or >= `minimum` when given)."""
    if minimum is None:
        return number(field, value, above=0.0, fix=fix or "Give a number of seconds.")
    return number(field, value, minimum=minimum, fix=fix or "Give a number of seconds.")


def integer(field: str, value: Any, *, minimum: int | None = None, fix: str = "") -> int:
    """An integer (not a bool, not a float such as 2.5 or 2.0), `>= minimum`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise wrong_type(field, value, "an integer", fix)
    if minimum is not None and value < minimum:
        raise ConfigError(field, value, f"must be an integer >= {minimum}."
                                        + (f" {fix}" if fix else ""))
    return int(value)


def optional_integer(field: str, value: Any, *, minimum: int, fix: str = "") -> int | None:
    """None, or an integer >= `minimum`."""
    return None if value is None else integer(field, value, minimum=minimum, fix=fix)


def boolean(field: str, value: Any) -> bool:
    """True or False exactly: 'no', 0 or None are refused, not read as truth values."""
    if not isinstance(value, bool):
        raise wrong_type(field, value, "a bool (True or False)")
    return value


def choice(field: str, value: Any, choices: tuple[str, ...], fix: str = "") -> str:
    """One of `choices` (strings)."""
    if not isinstance(value, str) or value not in choices:
        raise ConfigError(field, value, f"must be one of {choices}." + (f" {fix}" if fix else ""))
    return value


def instance(field: str, value: Any, expected: type | tuple[type, ...], *,
             optional: bool = False, fix: str = "") -> Any:
    """`value` is an instance of `expected` (or None when `optional`)."""
    if value is None and optional:
        return None
    if not isinstance(value, expected):
        names = _type_names(expected) + (" or None" if optional else "")
        raise wrong_type(field, value, names, fix)
    return value


def callable_(field: str, value: Any, *, optional: bool = False, fix: str = "") -> Any:
    """A callable (or None when `optional`)."""
    if value is None and optional:
        return None
    if not callable(value):
        raise wrong_type(field, value, "a callable" + (" or None" if optional else ""), fix)
    return value


def string_set(field: str, value: Any, fix: str = "") -> frozenset[str]:
    """A collection of non-empty strings; a bare string is refused (it is not a set of one)."""
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise wrong_type(field, value, "a set of strings, e.g. {'step'}", fix)
    items = list(value)
    for item in items:
        if not isinstance(item, str) or not item:
            raise ConfigError(field, value, f"holds {item!r}: every entry must be a non-empty "
                                            "string." + (f" {fix}" if fix else ""))
    return frozenset(items)


def number_map(field: str, value: Any, *, minimum: float | None = None,
               above: float | None = None, fix: str = "") -> dict[str, float]:
    """A dict of non-empty string keys to finite numbers (checked as `number`)."""
    if not isinstance(value, dict):
        raise wrong_type(field, value, "a dict of str to numbers", fix)
    for key, amount in value.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(field, value, f"has the key {key!r}: keys must be non-empty "
                                            "strings." + (f" {fix}" if fix else ""))
        number(f"{field}[{key!r}]", amount, minimum=minimum, above=above, fix=fix)
    return value
