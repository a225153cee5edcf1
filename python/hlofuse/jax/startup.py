"""Arms the compile hook for the moment `jax` is imported; `hlofuse-jax.pth` imports this at interpreter start-up.

JAX runs the jax_plugins entry point (hlofuse.jax.plugin) only when it starts its backends: at the first
`jax.devices()`, or at `get_topology_desc(..., "cuda")`. A deviceless TPU compile (a topology from
`get_topology_desc("v5e:1x1", "tpu")`, which loads libtpu itself) reaches `compile_or_get_cached` first and
starts the backends only inside it, too late: XLA then rejects the process's first `hlofuse_*` option with
`No such compile option`. So a meta-path finder waits for `import jax`, lets the normal finders load it, and
calls `plugin.initialize()` once jax's `__init__` has run, before any compile can start.

At start-up this costs one finder on `sys.meta_path` and no imports beyond `hlofuse` itself: a process that
never imports jax pays nothing more. `HLOFUSE_STARTUP_HOOK=0` leaves the finder out (the entry point still
installs the hook when the backends start).
"""

from __future__ import annotations

import os
import sys

DISABLE_ENV = "HLOFUSE_STARTUP_HOOK"


class InstallAfterJaxImport:
    """A meta-path finder for `jax` only: the spec the other finders give, its loader calling `installed()` after it."""

    def find_spec(self, name, path=None, target=None):  # noqa: ANN001, ANN201 - importlib's protocol
        if name != "jax":
            return None
        spec = None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                break
        loader = getattr(spec, "loader", None)
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return spec

        def exec_module_then_install(module):  # noqa: ANN001, ANN202
            exec_module(module)  # jax's own __init__; an ImportError there propagates and installs nothing
            try:
                del loader.exec_module  # the loader is jax's own again (for a reload)
            except AttributeError:
                pass
            disarm()
            installed()

        # An instance attribute: jax's spec keeps its own loader (and its type, for importlib.resources).
        loader.exec_module = exec_module_then_install
        return spec


def installed() -> None:
    """plugin.initialize(), which never breaks `import jax`: a failure is logged on the "hlofuse" logger."""
    try:
        from hlofuse.jax import plugin

        plugin.initialize()
    except Exception:
        import logging

        logging.getLogger("hlofuse").exception("hlofuse: installing the compile hook at `import jax` failed")


def arm() -> None:
    """Puts the finder first on sys.meta_path, unless jax is already imported or HLOFUSE_STARTUP_HOOK=0."""
    if os.environ.get(DISABLE_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return
    if "jax" in sys.modules or any(isinstance(f, InstallAfterJaxImport) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, InstallAfterJaxImport())


def disarm() -> None:
    """Removes the finder (after jax imported, or for a test)."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, InstallAfterJaxImport)]
