#!/usr/bin/env bash
# The prepared GPU check, on a lent GPU machine's own Python (it installs nothing; never run
# scripts/setup.sh there): writes OUT_DIR/gpu_check.json, rewritten after every measured row, and
# OUT_DIR/gpu_check.log. The check keeps its own deadline (7 min by default, --deadline-s); the
# timeout here is the backstop (SIGTERM: the check writes what exists; SIGKILL 15 s later).
#   scripts/gpu_check.sh "$OUT"                  # on the GPU machine; carry .gpu_carry for bitsandbytes
#   scripts/gpu_check.sh /tmp/gc --dry-run       # CPU smoke run, here
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:?usage: scripts/gpu_check.sh OUT_DIR [gpu_check.py flags, e.g. --dry-run --deadline-s 300]}"
shift
mkdir -p "$OUT_DIR"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
exec timeout -k 15 "${GPU_CHECK_TIMEOUT:-480}" "$PY" -u scripts/gpu_check.py --out "$OUT_DIR/gpu_check.json" "$@"
