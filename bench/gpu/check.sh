#!/usr/bin/env bash
# One prepared GPU check of the Triton kernels (correctness at real shapes, then timings).
#   bench/gpu/check.sh            on a CUDA machine (finishes in well under 8 minutes)
#   bench/gpu/check.sh --dry-run  tiny shapes through the Triton interpreter on a CPU
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
exec timeout 470 "$PY" bench/gpu/check.py "$@"
