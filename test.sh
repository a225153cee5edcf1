#!/usr/bin/env bash
# The tests against a fresh build in .venv: lint, the lit generators' --check, lit/FileCheck and pytest.
# ./test.sh is the full suite (CI runs it through .ci/run); ./test.sh --fast is the quick tier. --help says more.
set -euo pipefail
cd "$(dirname "$0")"

usage() {
  cat <<'EOF'
usage: ./test.sh [--fast | --full] [--help]

  (no flag), --full  the full suite, as CI runs it (.ci/run): 49 min on 2 cores (a clean clone, 2026-12-06);
                     it also installs the TPU and GPU compilers (.[accelerators]) and compiles every kernel
                     with them (test/python/test_compile_grid.py); a failed install stops it with a message
  --fast             the quick tier: the same lint, generator checks and lit, and pytest without the
                     tests marked slow (test/conftest.py's SLOW table), hypothesis at its `fast` profile;
                     3.5 min on 2 idle cores on 2026-12-01; more than 15 min on 2026-12-04 (the catalogues grew)

Both tiers run, in order:
  ruff, clang-format                    lint
  lit generators' --check               tools/gen_lit_attention.py, test/python/sampling_variants.py:
                                        the generated lit files match their catalogues
  lit test/                             passes and hlofuse-opt through FileCheck
  pytest -n 2 test/                     (--fast: -m "not slow"); the slowest 15 tests are listed at the end

Environment: JAX_PLATFORMS (default cpu: installed TPU/CUDA plugins must not start), HYPOTHESIS_PROFILE
(default ci for the full suite, fast for --fast; thorough runs hundreds of examples), PYTEST_ADDOPTS (more
pytest flags). The tiers and their measured times: docs/architecture.md, "Tests and their tiers".
EOF
}

tier=full
for arg in "$@"; do
  case "$arg" in
    --fast) tier=fast ;;
    --full) tier=full ;;
    -h | --help) usage; exit 0 ;;
    *) echo "test.sh: unknown argument '$arg'" >&2; usage >&2; exit 2 ;;
  esac
done

export JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}"
# Both pytest workers may load libtpu for deviceless TPU compiles; without this the second waits on its lock.
export ALLOW_MULTIPLE_LIBTPU_LOAD="${ALLOW_MULTIPLE_LIBTPU_LOAD:-1}"
if [ "$tier" = fast ]; then
  export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-fast}"
  marks=(-m "not slow")
else
  export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}"
  marks=()
fi

start=$SECONDS
stage_start=$SECONDS
times=()
stage() {  # prints a stage header; records how long the previous one took
  if [ -n "${stage_name:-}" ]; then times+=("$(printf '%5ds  %s' $((SECONDS - stage_start)) "$stage_name")"); fi
  stage_name="$1"
  stage_start=$SECONDS
  [ -n "$1" ] && echo "== $1"
  return 0
}

summary() {
  local rc=$?
  stage ""
  echo "== test.sh $tier: $([ "$rc" = 0 ] && echo passed || echo "FAILED (exit $rc)") in $((SECONDS - start))s"
  printf '%s\n' "${times[@]}"
}
trap summary EXIT
# A signal (an outer `timeout`, ^C) must end the run as failed: without these the EXIT trap reads the status of the
# last command that finished, and a killed run printed "passed".
trap 'exit 143' TERM
trap 'exit 130' INT
trap 'exit 129' HUP

# The full tier also installs the TPU and GPU compilers (the `accelerators` extra: libtpu, and jax's CUDA
# plugin with ptxas and the CUDA runtime, without cuDNN, cuBLAS or NCCL), so that test/python/test_compile_grid.py
# and lit's --compile-for tests compile every kernel for real; HLOFUSE_REQUIRE_COMPILERS=1 makes those tests fail,
# not skip, when a compiler is missing.
if [ "$tier" = full ]; then extras="test,accelerators"; else extras="test"; fi
stage "install (.venv, editable, .[$extras])"
if ! HLOFUSE_EXTRAS="$extras" source tools/venv.sh; then
  echo "test.sh: installing .[$extras] into ${VENV:-.venv} failed (see pip's message above)." >&2
  if [ "$tier" = full ]; then
    echo "test.sh: the full tier needs the TPU and GPU compilers: libtpu and jax's CUDA plugin with ptxas," \
      "so network access to PyPI and ~2 GB of disk for the venv ($(df -h --output=avail . | tail -1 | tr -d ' ')" \
      "free here); ./test.sh --fast runs without them." >&2
  fi
  exit 1
fi
if [ "$tier" = full ]; then export HLOFUSE_REQUIRE_COMPILERS=1; fi
export PATH="$VENV/bin:$PATH"
stage "ruff"
ruff check python passes test tools
stage "clang-format"
git ls-files -z '*.cc' '*.h' | xargs -0 clang-format --dry-run --Werror
stage "lit generators --check"
python tools/gen_lit_attention.py --check
python test/python/sampling_variants.py --check || {
  echo "test/passes/fuse_sampling.mlir is out of date; run python test/python/sampling_variants.py" >&2
  exit 1
}
stage "lit"
lit -sv test/
stage "pytest ($tier: HYPOTHESIS_PROFILE=$HYPOTHESIS_PROFILE${marks:+, -m \"not slow\"})"
# The editable install makes `import hlofuse` resolve to this checkout.
python -m pytest -n 2 -p no:cacheprovider --durations=15 "${marks[@]}" test/
