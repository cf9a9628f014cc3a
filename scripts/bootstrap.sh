#!/usr/bin/env bash
# Creates .venv (idempotent) with the CPU build of torch first, then the project.
# torch==2.13.0 is installed before anything else: on this kind of machine that version is a
# local CPU wheel, and letting pip resolve "torch" on its own would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
"$VPY" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
if ! "$VPY" -c "import torch" >/dev/null 2>&1; then
  "$VPY" -m pip install -q "torch==${TORCH_VERSION:-2.13.0}"
fi
stamp=.venv/.rr-installed-$(sha1sum pyproject.toml | cut -c1-12)-${1:-base}
if [ ! -f "$stamp" ]; then
  if [ "${1:-}" = "test" ]; then
    "$VPY" -m pip install -q -e ".[test]"
  else
    "$VPY" -m pip install -q -e .
  fi
  touch "$stamp"
fi
