#!/usr/bin/env bash
# The main job: builds hlofuse into its own virtualenv (.venv) and runs the demo.
# Usage: ./run.sh [demo flags]   (./run.sh --help lists them)
set -euo pipefail
cd "$(dirname "$0")"
source tools/venv.sh
exec "$VENV/bin/python" -m hlofuse.demo "$@"
