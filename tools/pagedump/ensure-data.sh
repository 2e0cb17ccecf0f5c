#!/usr/bin/env bash
# Makes the real page files data/pages-{python,node,java,mixed}.bin (with .json sidecars)
# unless they are already there. Used by tests and benchmarks; data/ is not committed.
# Usage: tools/pagedump/ensure-data.sh [MIB_PER_PROGRAM]   (default 64)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
exec python3 "$here/pagedump.py" --ensure --data-dir "$here/../../data" --mib "${1:-64}"
