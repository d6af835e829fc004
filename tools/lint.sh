#!/usr/bin/env bash
# Lint leg of CI: ruff over the Python code (rules and line length in pyproject.toml's
# [tool.ruff]) and clang-format over the C++ (.clang-format), at the versions pinned here.
#
#   bash tools/lint.sh             # installs the two linters into the active Python, then checks
#   bash tools/lint.sh --fix       # rewrites what they can (ruff --fix, clang-format -i)
#
# Exits non-zero when a file breaks a rule or is not formatted.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
RUFF_VERSION=0.17.6
CLANG_FORMAT_VERSION=23.1.5
"$PYTHON" -m pip install --quiet "ruff==$RUFF_VERSION" "clang-format==$CLANG_FORMAT_VERSION"
bin=$("$PYTHON" -c 'import os, sys; print(os.path.dirname(sys.executable))')
mapfile -t cxx < <(git ls-files '*.cc' '*.h')
if [ "${1:-}" = "--fix" ]; then
  "$bin/ruff" check --fix .
  "$bin/clang-format" -i "${cxx[@]}"
  exit 0
fi
echo "ruff $("$bin/ruff" --version | cut -d' ' -f2): $(git ls-files '*.py' | wc -l) Python files"
"$bin/ruff" check --no-cache .
echo "clang-format $CLANG_FORMAT_VERSION: ${#cxx[@]} C++ files"
"$bin/clang-format" --dry-run --Werror "${cxx[@]}"
echo "lint passed"
