# Sourced by run.sh and test.sh: creates .venv when missing and (re)installs hlofuse into it, editable, so
# the tests and the demo run the checkout (the C++ kernels build into build/ and install into the venv).
# HLOFUSE_EXTRAS selects optional dependencies (e.g. "test").
VENV="${VENV:-$PWD/.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "hlofuse: creating virtualenv $VENV" >&2
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
fi
spec="."
if [ -n "${HLOFUSE_EXTRAS:-}" ]; then spec=".[${HLOFUSE_EXTRAS}]"; fi
echo "hlofuse: building and installing $spec into $VENV (first run downloads jax and builds the C++ kernels)" >&2
"$VENV/bin/python" -m pip install --quiet --editable "$spec"
