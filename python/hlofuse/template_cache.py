"""Texts that cost JAX a trace and a lowering, kept on disk across processes: the sampling pass's templates.

hlofuse-fuse-sampling lowers each candidate form's reference function at a site's shape (`_template_text`), tens
to hundreds of lowerings for the first site of a shape in a process, a tenth of a second each. The lowering
depends only on the arguments, JAX's version and hlofuse's own code, so the text is kept under a directory named
by a fingerprint of those (jax and jaxlib versions, and the contents of every Python file of hlofuse and its
passes): any change to either starts a new directory, and a later process of the same install reads the texts
back instead of lowering again.

    HLOFUSE_CACHE_DIR   the directory (default ~/.cache/hlofuse, which hlofuse-report's host measurements share);
                        "off" (or empty) turns this cache off

Writes are atomic (a temporary file, then os.replace), so concurrent compiles, in threads or processes, never
read a partial text; a text that cannot be read or written is computed as without the cache. The directory keeps
the newest `KEEP_FINGERPRINTS` installs' texts and removes older ones.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from hlofuse.cache import CACHE_ENV, cache_root

__all__ = ["CACHE_ENV", "KEEP_FINGERPRINTS", "cache_root", "cached_text", "fingerprint"]

KEEP_FINGERPRINTS = 3  # installs (hlofuse + JAX versions) whose texts stay on disk


@functools.cache
def fingerprint() -> str:
    """A digest of what a lowering's text depends on besides its arguments: JAX's versions and hlofuse's code."""
    import jax
    import jaxlib

    import hlofuse
    import hlofuse.passes

    digest = hashlib.sha256(f"jax {jax.__version__} jaxlib {jaxlib.__version__}".encode())
    roots = sorted({Path(p) for package in (hlofuse, hlofuse.passes) for p in package.__path__})
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:24]


def _prune(root: Path, current: Path) -> None:
    """Removes the texts of all but the newest KEEP_FINGERPRINTS installs (by their directories' times)."""
    others = [d for d in root.iterdir() if d.is_dir() and d != current and len(d.name) == len(current.name)]
    others.sort(key=lambda d: d.stat().st_mtime, reverse=True)
    for stale in others[KEEP_FINGERPRINTS - 1:]:
        shutil.rmtree(stale, ignore_errors=True)


@functools.cache
def _directory(root: Path, print_: str) -> Path:
    """This install's directory under `root`, made (and the stale ones pruned) once per process."""
    directory = root / print_
    directory.mkdir(parents=True, exist_ok=True)
    os.utime(directory)  # the newest install in use, for _prune
    _prune(root, directory)
    return directory


def cached_text(kind: str, key: tuple[object, ...], compute: Callable[[], str]) -> str:
    """`compute()`, or the text a process of this install computed for the same `kind` and `key` (whose repr must
    say everything the text depends on besides JAX and hlofuse)."""
    root = cache_root()
    if root is None:
        return compute()
    try:
        directory = _directory(root, fingerprint())
    except OSError:  # not writable here: no cache
        return compute()
    path = directory / f"{kind}-{hashlib.sha256(repr(key).encode()).hexdigest()[:32]}.mlir"
    try:
        return path.read_text()
    except OSError:
        pass
    text = compute()
    _write(path, text)
    return text


def _write(path: Path, text: str) -> None:
    """Writes `text` to `path` atomically; a failure leaves no file."""
    temporary = None
    try:
        with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=".tmp-", suffix=".mlir", delete=False) as out:
            temporary = out.name
            out.write(text)
        os.replace(temporary, path)
    except OSError:
        if temporary is not None:
            Path(temporary).unlink(missing_ok=True)
