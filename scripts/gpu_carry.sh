#!/usr/bin/env bash
# What the lent GPU machine's image lacks for the GPU check's bitsandbytes sections, pruned to fit what
# a run may carry (64 MiB in all): bitsandbytes with only its CPU and CUDA 13.0 libraries (about 4 MB of
# the wheel's ~125 MB; the image has torch 2.11.0+cu130) and packaging (which bitsandbytes imports),
# unpacked into .gpu_carry/site (git-ignored). scripts/gpu_check.py finds it there by itself; carry the
# folder with the run (carry: [".gpu_carry"]). Run here, where pip reaches the registry; never there.
#   scripts/gpu_carry.sh            # BNB_VERSION=0.50.2 BNB_CUDA=130 by default
set -euo pipefail
cd "$(dirname "$0")/.."
BNB_VERSION="${BNB_VERSION:-0.50.2}"
BNB_CUDA="${BNB_CUDA:-130}"
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
dl="$(mktemp -d)"
trap 'rm -rf "$dl" .gpu_carry.new' EXIT
# The wheels for the image's Python (3.12, x86_64 Linux), whatever Python runs pip here.
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --implementation cp --python-version 3.12 \
    --platform manylinux_2_24_x86_64 --platform any -d "$dl" "bitsandbytes==$BNB_VERSION" "packaging>=20.9"
rm -rf .gpu_carry.new
mkdir -p .gpu_carry.new/site
for w in "$dl"/*.whl; do "$PY" -m zipfile -e "$w" .gpu_carry.new/site; done
lib=".gpu_carry.new/site/bitsandbytes/libbitsandbytes_cuda${BNB_CUDA}.so"
[ -f "$lib" ] || { echo "gpu_carry: bitsandbytes $BNB_VERSION has no $(basename "$lib")" >&2; exit 1; }
find .gpu_carry.new/site/bitsandbytes -maxdepth 1 -name 'libbitsandbytes_*.so' \
    ! -name libbitsandbytes_cpu.so ! -name "libbitsandbytes_cuda${BNB_CUDA}.so" -delete
find .gpu_carry.new/site -name '__pycache__' -prune -exec rm -rf {} +
rm -rf .gpu_carry
mv .gpu_carry.new .gpu_carry
echo "gpu_carry: $(du -sh .gpu_carry | cut -f1) in .gpu_carry/site: $(cd .gpu_carry/site && ls -d */ | tr -d / | tr '\n' ' ')"
ls -la .gpu_carry/site/bitsandbytes/*.so
