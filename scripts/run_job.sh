#!/usr/bin/env bash
# Set up (if needed) and run the example job: tiny LLaMA, FSDP2, 2 CPU workers on a local Ray.
# Extra arguments go to jobs/train_llama_fsdp.py, e.g. `bash scripts/run_job.sh --max_steps 100`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/python jobs/train_llama_fsdp.py "$@"
