#!/usr/bin/env bash
# Packs what `jobs/gpu_check.py` needs on a GPU machine that has Python 3.12 and torch but no Ray
# and no network (the device tool's nvidia-h200 machine): Ray 2.60 and the few packages it and
# ray_resilience import that such an image lacks, unpacked and stripped of Ray's Java jars and
# dashboard web build, as one .whl/site312.tar.xz (~31 MB) to carry next to the working tree.
#
#   bash scripts/gpu_payload.sh            # here, once (needs PyPI)
#
# Then on the GPU machine, from the repository root (carry .whl):
#   mkdir -p /tmp/site && tar xJf .whl/site312.tar.xz -C /tmp/site && \
#   PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 python3 jobs/gpu_check.py \
#       --code <commit> --out $OUT/gpu_check.json 2>&1 | tee $OUT/log.txt
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$work/wheels" \
    ray==2.60.0 jsonschema referencing jsonschema-specifications rpds-py crc32c
mkdir -p "$work/site" .whl
for wheel in "$work"/wheels/*.whl; do
    unzip -q -o "$wheel" -d "$work/site"
done
rm -rf "$work/site/ray/jars" "$work/site/ray/dashboard/client/build"
tar -cf - -C "$work/site" . | xz -T0 -6 > .whl/site312.tar.xz
ls -la .whl/site312.tar.xz
