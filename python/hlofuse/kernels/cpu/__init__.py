"""Native CPU kernels behind XLA's FFI (C++ in this folder, built by its CMakeLists.txt).

`register()` loads the shared library and registers every `hlofuse_*` target for the CPU platform.
The library is looked up next to this file (the installed wheel), then at the path in the
HLOFUSE_CPU_KERNELS_LIB environment variable (a scratch cmake build during development).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import threading
from pathlib import Path

import jax

TARGETS = ("hlofuse_attention", "hlofuse_sample", "hlofuse_sample_top_k", "hlofuse_sample_top_mass",
           "hlofuse_sample_sort", "hlofuse_sample_sort_descending", "hlofuse_sample_sort_integers",
           "hlofuse_sample_nucleus_band",
           "hlofuse_sample_at_or_above",
           "hlofuse_sample_whole_rows", "hlofuse_sample_noise_bits")
LIB_ENV = "HLOFUSE_CPU_KERNELS_LIB"
ISA_ENV = "HLOFUSE_CPU_ISA"  # caps the kernel a call picks; read by the library on every call
_LIB_NAMES = ("libhlofuse_cpu_kernels.so", "libhlofuse_cpu_kernels.dylib", "hlofuse_cpu_kernels.dll")

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_registered = False


def library_path() -> Path | None:
    """Where the kernel library is: next to this package, else $HLOFUSE_CPU_KERNELS_LIB; None if absent."""
    # An editable install keeps the built library in site-packages, which the package path also lists.
    folders = [Path(__file__).resolve().parent, *(Path(p) for p in __path__)]
    for folder in folders:
        for name in _LIB_NAMES:
            if (folder / name).is_file():
                return folder / name
    env = os.environ.get(LIB_ENV)
    if env and Path(env).is_file():
        return Path(env)
    return None


def library_digest() -> str:
    """A short digest of the kernel library's bytes ("none" when it is absent), for the persistent cache
    key: a rebuilt library can change what a custom call computes, or the operands and attributes it
    takes, while hlofuse's version and the emitted IR stay the same."""
    path = library_path()
    return _file_digest(str(path)) if path is not None else "none"


@functools.cache
def _file_digest(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as library:
        for chunk in iter(lambda: library.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()[:16]


def _load() -> ctypes.CDLL:
    global _lib
    if _lib is None:
        path = library_path()
        if path is None:
            raise RuntimeError(
                f"hlofuse CPU kernel library not found next to {__file__} or at ${LIB_ENV}; "
                "build it with cmake"
            )
        _lib = ctypes.cdll.LoadLibrary(str(path))
    return _lib


def is_available() -> bool:
    """True when the kernel library exists and loads."""
    try:
        _load()
    except (RuntimeError, OSError):
        return False
    return True


def register() -> None:
    """Loads the library and registers each `hlofuse_*` FFI target for the CPU (idempotent, thread-safe)."""
    global _registered
    if _registered:
        return
    with _lock:
        if _registered:
            return
        lib = _load()
        for name in TARGETS:
            jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, name)), platform="cpu")
            # Under SPMD, calls annotated with `num_batch_dims` (hlofuse.sharding) run per shard.
            jax.ffi.register_ffi_target_as_batch_partitionable(name)
        _registered = True


def isa() -> str:
    """The kernel picked here: "amx", "avx512bf16", "avx512", "avx2" or "generic" ($HLOFUSE_CPU_ISA lowers it,
    or names "amx-emulated", the AMX kernel with its tile instructions in software, for tests)."""
    fn = _load().hlofuse_cpu_isa
    fn.restype = ctypes.c_char_p
    return fn().decode()


__all__ = ["LIB_ENV", "TARGETS", "is_available", "isa", "library_digest", "library_path", "register"]
