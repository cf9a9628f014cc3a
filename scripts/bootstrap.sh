#!/usr/bin/env bash
# Creates .venv (idempotent) with the CPU build of torch first, then the project.
# torch==2.13.0 is installed before anything else: on this kind of machine that version is a
# local CPU wheel (pip's configured find-links), and letting an installer resolve "torch" on its
# own would pull a multi-GB CUDA build. Installs go through uv (parallel downloads and bytecode
# compilation, several times faster than pip); pip does them wherever uv cannot.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH="torch==${TORCH_VERSION:-2.13.0}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
UV=.venv/bin/uv
[ -x "$UV" ] || "$VPY" -m pip install -q "uv>=0.5" >/dev/null 2>&1 || true
uv_install() {
  [ -x "$UV" ] && "$UV" pip install -q --python "$VPY" --compile-bytecode "$@"
}
if ! "$VPY" -c "import torch" >/dev/null 2>&1; then
  # Only from the local wheels (never an index): its dependencies come with the project below.
  links=$("$VPY" -m pip config get global.find-links 2>/dev/null || true)
  if [ -z "$links" ] || ! uv_install --no-deps --no-index --find-links "$links" "$TORCH"; then
    "$VPY" -m pip install -q "$TORCH"
  fi
fi
stamp=.venv/.rr-installed-$(sha1sum pyproject.toml | cut -c1-12)-${1:-base}
if [ ! -f "$stamp" ]; then
  target="."
  if [ "${1:-}" = "test" ]; then
    target=".[test]"
  fi
  # The torch installed above satisfies the project's requirement: it stays.
  uv_install -e "$target" || "$VPY" -m pip install -q -e "$target"
  touch "$stamp"
fi
