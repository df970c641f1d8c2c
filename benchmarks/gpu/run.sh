#!/usr/bin/env bash
# simpar's first contact with a GPU: device facts, CUDA tests, kernel microbenchmarks,
# `simpar calibrate` on the device and a closed loop of single-GPU plans, in at most 8 minutes,
# everything under one folder. See benchmarks/gpu/README.md.
#
#   bash benchmarks/gpu/run.sh [--dry] [--out DIR] [--gpu PRESET] [--only STAGES] [--tar FILE.tar.gz]
#
# --dry: every stage on the CPU with tiny sizes (about a minute), to test this script.
# Exit codes: 0 every stage ok, 1 a stage failed (recorded in DIR/summary.md), 2 bad input or no CUDA device.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
PY="${PYTHON:-python3}"
case " $* " in *" -h "*|*" --help "*) exec "$PY" benchmarks/gpu/first_contact.py --help ;; esac
# simpar imports as `simpar` only once installed (pyproject maps its folders under that name); a
# bare GPU machine gets this checkout installed in place, without touching its other packages.
if ! "$PY" -c "import simpar.sim" >/dev/null 2>&1; then
    echo "note: simpar is not installed for $PY: pip install --no-deps --no-build-isolation -e . (this checkout)" >&2
    if ! "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e . >&2; then
        echo "error: simpar: cannot be installed for $PY from $(pwd). Fix: run '$PY -m pip install -e .' and read its error." >&2
        exit 2
    fi
fi
exec env PYTHONUNBUFFERED=1 "$PY" benchmarks/gpu/first_contact.py "$@"
