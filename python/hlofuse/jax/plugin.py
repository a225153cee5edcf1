"""The `jax_plugins` entry point: JAX imports this module at backend start-up and calls `initialize()`.

It registers no PJRT backend. It only installs the compile hook, so that
`jax.jit(f, compiler_options={"hlofuse_pipeline": "default"})` works without `import hlofuse`.
JAX merely logs an exception raised here, so on an untested jax this warns (once) instead.
`hlofuse.jax.startup` calls `initialize()` earlier, right after `import jax`: a deviceless TPU compile
starts the backends only inside its first compile.
"""

from __future__ import annotations

import threading
import warnings

from hlofuse.jax import hook

_warned = False
_warn_lock = threading.Lock()


def initialize() -> None:
    """Installs the hook if this jax has the internals it was tested against; warns once if not."""
    global _warned
    problems = hook.check_hook_points()
    if not problems:
        hook.install()
        return
    with _warn_lock:
        if _warned:
            return
        _warned = True
    warnings.warn(
        "hlofuse: compile hook not installed, 'hlofuse_*' compiler options will be rejected by XLA: "
        + "; ".join(problems),
        RuntimeWarning,
        stacklevel=2,
    )
