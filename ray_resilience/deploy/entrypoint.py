"""Read a job entrypoint the way the shell would: the first `python <script>` (or `-m`)
invocation and its flags, up to the next shell operator.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

_PYTHON = re.compile(r"^(?:.*/)?python(?:\d+(?:\.\d+)?)?$")
_SHELL_OPERATORS = frozenset({"&&", "||", ";", "|", "&"})
_INTERPRETER_FLAGS = frozenset({"-u", "-B", "-O", "-OO", "-E", "-s", "-S", "-I"})


@dataclass(frozen=True)
class Entrypoint:
    """The `python <script> --flag value ...` part of a job entrypoint."""

    script: str | None
    """Script path as written; `-m a.b` becomes `a/b.py`; None without a python invocation."""
    args: dict[str, str | bool]
    """Flags as argparse reads them: {"num_workers": "16"}, a bare flag True, `-` as `_`."""


def parse_entrypoint(text: str) -> Entrypoint:
    """Parse a shell command line; raises ValueError on unbalanced quotes."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    tokens = list(lexer)
    for i, token in enumerate(tokens):
        if not _PYTHON.match(token):
            continue
        rest = tokens[i + 1 :]
        end = next((j for j, t in enumerate(rest) if t in _SHELL_OPERATORS), len(rest))
        rest = rest[:end]
        while rest and rest[0] in _INTERPRETER_FLAGS:
            rest = rest[1:]
        if len(rest) >= 2 and rest[0] == "-m":
            return Entrypoint(rest[1].replace(".", "/") + ".py", _parse_args(rest[2:]))
        if rest and rest[0].endswith(".py"):
            return Entrypoint(rest[0], _parse_args(rest[1:]))
    return Entrypoint(None, {})


def _parse_args(tokens: list[str]) -> dict[str, str | bool]:
    args: dict[str, str | bool] = {}
    i = 0
    while i < len(tokens):
        if tokens[i].startswith("--"):
            key, eq, value = tokens[i][2:].partition("=")
            key = key.replace("-", "_")
            if eq:
                args[key] = value
            elif i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
                args[key] = tokens[i + 1]
                i += 1
            else:
                args[key] = True
        i += 1
    return args
