"""hlofuse inside `jax.jit`: the compile hook behind the `hlofuse_*` compiler options.

Installed when jax is imported (`hlofuse-jax.pth` arms `hlofuse.jax.startup`), at JAX backend start-up through
the `jax_plugins` entry point (`hlofuse.jax.plugin`), or explicitly with `install()`. See docs/jit.md.

The names below load hook.py on first use, so the start-up import of this package stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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


def __getattr__(name: str) -> Any:  # noqa: ANN401 - a lazy re-export of hook.py
    if name in __all__:
        from hlofuse.jax import hook

        return getattr(hook, name)
    raise AttributeError(f"module 'hlofuse.jax' has no attribute {name!r}")
