#!/usr/bin/env bash
# The prepared GPU check (one H200-class GPU, ≤ 8 minutes): GPT-2 small training tokens/s and MFU with
# flash attention pinned, the SDPA backend observed, a reference-vs-fused attention sweep, and
# bitsandbytes INT8/NF4. Writes one JSON summary (default under benchmarks/results/).
#   scripts/gpu_check.sh [OUT.json] [extra gpu_check.py flags, e.g. --dry-run]
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
OUT="${1:-benchmarks/results/gpu_check_$(date +%Y%m%d).json}"
shift || true
exec timeout 480 "$PY" scripts/gpu_check.py --out "$OUT" "$@"
