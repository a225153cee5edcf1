"""hlofuse inside `jax.jit`: the compile hook behind the `hlofuse_*` compiler options.

Installed at JAX backend start-up through the `jax_plugins` entry point (`hlofuse.jax.plugin`), or
explicitly with `install()`. See docs/jit.md.
"""

from __future__ import annotations

from hlofuse.jax.hook import (
    OPTION_KEYS,
    HlofuseCompileError,
    HlofuseFallbackWarning,
    HlofuseHookError,
    check_hook_points,
    install,
    is_installed,
    uninstall,
)

__all__ = [
    "OPTION_KEYS",
    "HlofuseCompileError",
    "HlofuseFallbackWarning",
    "HlofuseHookError",
    "check_hook_points",
    "install",
    "is_installed",
    "uninstall",
]
