"""Read a job entrypoint the way the shell would: which script runs, with which flags.

Only the first `python <script>` (or `python -m <module>`) invocation counts; commands chained
before it (`cd /app && ...`) are skipped, and the arguments stop at the next shell operator.
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
    """Script path as written (`jobs/train_llama_fsdp.py`); `-m a.b` becomes `a/b.py`; None if
    there is no python invocation."""
    args: dict[str, str | bool]
    """`--num_workers 16` -> {"num_workers": "16"}; a bare `--use_gpu` -> {"use_gpu": True};
    `--num-workers` is normalised to `num_workers` as argparse does."""


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
