"""lit configuration: every *.mlir under test/ is a lit test run through tools/hlofuse-opt.

Substitutions: `hlofuse-opt` runs the source checkout's tools/hlofuse-opt with the Python that runs lit
(no install needed); `FileCheck` and `filecheck` run the PyPI `filecheck` with variables scoped per
CHECK-LABEL; `%python` is that Python. A directory of Python lit scripts opts in with a lit.local.cfg
holding `config.suffixes.add(".py")` (test/python is pytest's, so .py is not a lit suffix by default).
"""

import os
import shutil
import sys

import lit.formats

# `config` and `lit_config` are injected by lit.
config = globals()["config"]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

config.name = "hlofuse"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = {".mlir"}
config.test_source_root = os.path.dirname(os.path.abspath(__file__))
config.test_exec_root = os.path.join(REPO, "build", "lit")
# Fixture and input folders hold files tests read, not tests; pytest's folders hold no lit tests.
config.excludes = {"fixtures", "inputs", "python", "kernels", "lit.cfg.py", "__pycache__"}

python = sys.executable
bindir = os.path.dirname(python)
filecheck = shutil.which("filecheck", path=bindir) or shutil.which("filecheck")
filecheck_cmd = f'"{filecheck}"' if filecheck else f'"{python}" -m filecheck'


def tool(name: str) -> str:
    """A regex matching `name` as a whole command word, not inside a path or a longer name."""
    return r"(?<![\w/.-])" + name.replace(".", r"\.") + r"(?![\w/.-])"


config.substitutions.append(("%python", f'"{python}"'))
config.substitutions.append(
    (tool("hlofuse-opt"), f'"{python}" "{os.path.join(REPO, "tools", "hlofuse-opt")}"')
)
config.substitutions.append((tool("FileCheck"), f"{filecheck_cmd} --enable-var-scope"))
config.substitutions.append((tool("filecheck"), f"{filecheck_cmd} --enable-var-scope"))

# Tests see the checkout's package and passes even when hlofuse is not installed.
config.environment["PYTHONPATH"] = os.pathsep.join(
    [os.path.join(REPO, "python"), os.environ.get("PYTHONPATH", "")]
).rstrip(os.pathsep)
for name in ("HOME", "TMPDIR", "XLA_FLAGS", "JAX_PLATFORMS", "HLOFUSE_CACHE_DIR"):  # (the templates on disk)
    if name in os.environ:
        config.environment[name] = os.environ[name]
config.environment.setdefault("JAX_PLATFORMS", "cpu")

# `REQUIRES: cpu-kernels` marks tests that need the native CPU kernel library (built by pip install .).
try:
    from hlofuse.kernels import cpu as _cpu_kernels

    if _cpu_kernels.is_available():
        config.available_features.add("cpu-kernels")
except ImportError:
    pass
