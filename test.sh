#!/usr/bin/env bash
# Every test: lint, the lit/FileCheck suite and pytest, against a fresh build in .venv.
set -euo pipefail
cd "$(dirname "$0")"
HLOFUSE_EXTRAS="test" source tools/venv.sh
export PATH="$VENV/bin:$PATH"
echo "== ruff"
ruff check python passes test tools
echo "== clang-format"
git ls-files -z '*.cc' '*.h' | xargs -0 clang-format --dry-run --Werror
echo "== lit"
lit -sv test/
echo "== pytest"
# The editable install makes `import hlofuse` resolve to this checkout.
python -m pytest -n 2 -p no:cacheprovider test/
