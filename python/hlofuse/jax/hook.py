"""The compile hook: runs an hlofuse pipeline on the StableHLO module that `jax.jit` hands to XLA.

JAX 0.10.2 sends every jit compile through `jax._src.compiler.compile_or_get_cached(backend,
computation, devices, compile_options, ...)`; `pxla._cached_compilation` looks it up as a module
attribute on each call. The user's `jax.jit(..., compiler_options=...)` arrive there as
`compile_options.env_option_overrides`, a list of (key, value) pairs. The hook wraps that function:

- with no `hlofuse_*` key it calls the original untouched (one scan of a short list);
- otherwise it strips the keys (XLA rejects unknown options), rewrites a clone of the module (the
  Lowered object owns the original), verifies it and compiles the clone; if anything fails it warns
  with `HlofuseFallbackWarning` and compiles the original, or raises `HlofuseCompileError` when
  `hlofuse_strict` is set.

The persistent cache key hashes the module it is given (the rewritten one) and the string returned
by `jax._src.cache_key.custom_hook()`; the hook chains that function to add hlofuse's version, the
pipeline and the target, so entries from different hlofuse versions or pipelines never collide.

This module is imported while `import jax` runs (hlofuse.jax.startup), so it imports jax, jaxlib's MLIR and
the pipeline inside the functions that need them: lazily, to keep `import jax` cheap and to not import jax
from within its own import. None of those imports dodges an import cycle.
"""

from __future__ import annotations

import inspect
import logging
import os
import re
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jaxlib.mlir import ir

    from hlofuse.pipeline import PipelineResult

logger = logging.getLogger("hlofuse")

PIPELINE_KEY = "hlofuse_pipeline"
TARGET_KEY = "hlofuse_target"
STRICT_KEY = "hlofuse_strict"
OPTION_KEYS = (PIPELINE_KEY, TARGET_KEY, STRICT_KEY)
_PREFIX = "hlofuse_"

# Inclusive range of jax versions whose internals the hook was tested against.
TESTED_JAX_VERSIONS = ((0, 10, 2), (0, 10, 2))
ALLOW_UNTESTED_ENV = "HLOFUSE_ALLOW_UNTESTED_JAX"
REMARKS_ENV = "HLOFUSE_REMARKS"

# The leading parameters of compile_or_get_cached the wrapper relies on, by name and position.
EXPECTED_PARAMETERS = ("backend", "computation", "devices", "compile_options")

# backend.platform -> the target name hlofuse-lower-kernels understands.
PLATFORM_TARGETS = {
    "cpu": "cpu",
    "gpu": "gpu",
    "cuda": "gpu",
    "rocm": "gpu",
    "tpu": "tpu",
    "neuron": "neuron",
}

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


class HlofuseFallbackWarning(UserWarning):
    """The pipeline failed on a jit compile; the original module was compiled instead."""


class HlofuseCompileError(RuntimeError):
    """The pipeline failed on a jit compile with `hlofuse_strict` set."""


class HlofuseHookError(RuntimeError):
    """The JAX internals the hook patches are not what this hlofuse version was tested against."""


@dataclass(frozen=True)
class HookOptions:
    """The hlofuse compiler options of one compile, parsed and checked."""

    pipeline: str | None
    target: str | None
    strict: bool


def _parse_bool(key: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value != 0
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise ValueError(f"compiler option '{key}' takes true or false (or 1/0), not {value!r}")


def _parse_str(key: str, value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"compiler option '{key}' takes a string, not {value!r}")
    return value


def split_options(overrides: Sequence[tuple[str, Any]]) -> tuple[HookOptions | None, list[tuple[str, Any]]]:
    """(hlofuse options or None when there are none, the remaining overrides for XLA)."""
    ours: dict[str, Any] = {}
    rest: list[tuple[str, Any]] = []
    for key, value in overrides:
        if isinstance(key, str) and key.startswith(_PREFIX):
            if key not in OPTION_KEYS:
                known = ", ".join(OPTION_KEYS)
                raise ValueError(f"unknown hlofuse compiler option '{key}' (known: {known})")
            ours[key] = value
        else:
            rest.append((key, value))
    if not ours:
        return None, rest
    pipeline = _parse_str(PIPELINE_KEY, ours[PIPELINE_KEY]) if PIPELINE_KEY in ours else None
    target = _parse_str(TARGET_KEY, ours[TARGET_KEY]) if TARGET_KEY in ours else None
    strict = _parse_bool(STRICT_KEY, ours[STRICT_KEY]) if STRICT_KEY in ours else False
    return HookOptions(pipeline, target or None, strict), rest


def platform_target(platform: str) -> str | None:
    """The kernel target for a PJRT platform name, or None for a platform hlofuse has no kernels for."""
    return PLATFORM_TARGETS.get(platform.lower())


# ----------------------------------------------------------------------------- rewriting

# One lock per MLIR context: two threads compiling the same Lowered share its context.
_context_locks: weakref.WeakKeyDictionary[Any, threading.Lock] = weakref.WeakKeyDictionary()
_context_locks_guard = threading.Lock()
_shared_lock = threading.Lock()


def _lock_for(context: object) -> threading.Lock:
    with _context_locks_guard:
        try:
            lock = _context_locks.get(context)
            if lock is None:
                lock = _context_locks[context] = threading.Lock()
            return lock
        except TypeError:  # a context type without weak references: serialise on one lock
            return _shared_lock


def _failing_stage(error: BaseException) -> str:
    try:
        from hlofuse.pipeline import PassFailure, PipelineError
    except ImportError:  # the failure may have been this very import
        return "pipeline run"
    if isinstance(error, PassFailure):
        return f"pass '{error.pass_name}'"
    if isinstance(error, PipelineError):
        return "pipeline setup"
    if isinstance(error, _VerifyError):
        return "verification of the rewritten module"
    return "pipeline run"


class _VerifyError(RuntimeError):
    pass


def _verify(module: ir.Module) -> None:
    from jaxlib.mlir import ir

    try:
        ok = module.operation.verify()
    except ir.MLIRError as error:
        raise _VerifyError(str(error)) from error
    if ok is False:
        raise _VerifyError("the rewritten module does not verify")


def rewrite_module(
    computation: ir.Module, pipeline: str, target: str | None
) -> tuple[ir.Module, PipelineResult]:
    """A verified, rewritten clone of `computation`; raises whatever the pipeline or verifier raised."""
    from jaxlib.mlir import ir

    from hlofuse.ir.context import clone_module
    from hlofuse.pipeline import run_pipeline

    context = computation.context
    with _lock_for(context), context, ir.Location.unknown(context):
        module = clone_module(computation)
        result = run_pipeline(module, pipeline, target=target)
        _verify(module)
    return module, result


def _remarks_enabled() -> bool:
    return os.environ.get(REMARKS_ENV, "").strip().lower() in _TRUE


def _report(module_name: str, result: PipelineResult) -> None:
    loud = _remarks_enabled()
    level = logging.INFO if loud else logging.DEBUG
    if logger.isEnabledFor(level) and result.counters:
        logger.log(level, "hlofuse: %s: %s", module_name, dict(result.counters))
    for remark in result.remarks:
        logger.log(level, "%s", remark)
        if loud:
            print(f"hlofuse: {module_name}: {remark}", file=sys.stderr)


def _module_name(computation: ir.Module) -> str:
    from jaxlib.mlir import ir

    try:
        return ir.StringAttr(computation.operation.attributes["sym_name"]).value
    except (KeyError, ValueError):
        return "<module>"


# ----------------------------------------------------------------------------- cache key

_local = threading.local()


def _cache_salt() -> str | None:
    return getattr(_local, "salt", None)


def _make_cache_key_hook(previous: Callable[[], str]) -> Callable[[], str]:
    def hlofuse_custom_hook() -> str:
        base = previous()
        salt = _cache_salt()
        if salt is None:
            return base
        return f"{base}|{salt}" if base else salt

    hlofuse_custom_hook._hlofuse_previous = previous  # type: ignore[attr-defined]
    return hlofuse_custom_hook


def cache_salt(options: HookOptions, target: str | None) -> str:
    """What a rewritten compile adds to the persistent cache key."""
    import hlofuse
    from hlofuse.kernels.cpu import library_digest

    return (f"hlofuse={hlofuse.__version__};kernels={library_digest()};pipeline={options.pipeline};"
            f"target={target}")


# ----------------------------------------------------------------------------- the wrapper


def _compile_with_hlofuse(
    original: Callable[..., Any],
    backend: Any,  # noqa: ANN401 - xc.Client
    computation: ir.Module,
    devices: Any,  # noqa: ANN401 - np.ndarray of devices
    compile_options: Any,  # noqa: ANN401 - xc.CompileOptions
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:  # noqa: ANN401 - xc.LoadedExecutable
    options, rest = split_options(compile_options.env_option_overrides)
    compile_options.env_option_overrides = rest
    if options is None:
        return original(backend, computation, devices, compile_options, *args, **kwargs)
    if options.pipeline is None:
        warnings.warn(
            f"hlofuse: '{TARGET_KEY}' or '{STRICT_KEY}' given without '{PIPELINE_KEY}'; nothing to run",
            HlofuseFallbackWarning,
            stacklevel=4,
        )
        return original(backend, computation, devices, compile_options, *args, **kwargs)

    target = options.target or platform_target(str(getattr(backend, "platform", "")))
    name = _module_name(computation)
    try:
        rewritten, result = rewrite_module(computation, options.pipeline, target)
    except Exception as error:
        _fall_back_or_raise(_failing_stage(error), error, name, options, target)
        return original(backend, computation, devices, compile_options, *args, **kwargs)

    _report(name, result)
    previous_salt = _cache_salt()
    _local.salt = cache_salt(options, target)
    try:
        return original(backend, rewritten, devices, compile_options, *args, **kwargs)
    except Exception as error:
        failure = error
    finally:
        _local.salt = previous_salt
    # XLA rejected the rewritten module. If it rejects the original too, the program (or an option)
    # is at fault, not hlofuse: that error propagates as it would without the hook.
    executable = original(backend, computation, devices, compile_options, *args, **kwargs)
    _fall_back_or_raise("XLA compile of the rewritten module", failure, name, options, target)
    return executable


def _fall_back_or_raise(
    stage: str, error: Exception, name: str, options: HookOptions, target: str | None
) -> None:
    """Raises HlofuseCompileError under `hlofuse_strict`; otherwise warns that the original is compiled."""
    message = (
        f"hlofuse: {stage} failed on '{name}' (pipeline {options.pipeline!r}, target {target}): "
        f"{type(error).__name__}: {error}"
    )
    if options.strict:
        raise HlofuseCompileError(message) from error
    warnings.warn(f"{message}; compiling the original module", HlofuseFallbackWarning, stacklevel=5)
    logger.debug("%s; compiling the original module", message)


def _make_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    def compile_or_get_cached(
        backend: Any,  # noqa: ANN401
        computation: ir.Module,
        devices: Any,  # noqa: ANN401
        compile_options: Any,  # noqa: ANN401
        *args: Any,  # noqa: ANN401
        **kwargs: Any,  # noqa: ANN401
    ) -> Any:  # noqa: ANN401
        # Fast path: no hlofuse key, so no parsing, no copying, nothing imported.
        for key, _ in compile_options.env_option_overrides:
            if isinstance(key, str) and key.startswith(_PREFIX):
                break
        else:
            return original(backend, computation, devices, compile_options, *args, **kwargs)
        return _compile_with_hlofuse(original, backend, computation, devices, compile_options, args, kwargs)

    compile_or_get_cached._hlofuse_original = original  # type: ignore[attr-defined]
    compile_or_get_cached.__wrapped__ = original  # type: ignore[attr-defined]
    compile_or_get_cached.__doc__ = original.__doc__
    return compile_or_get_cached


# ----------------------------------------------------------------------------- guard and install


def _version_tuple(version: str) -> tuple[int, int, int] | None:
    found = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    return (int(found[1]), int(found[2]), int(found[3])) if found else None


def check_hook_points() -> list[str]:
    """Why the hook cannot be installed on this jax (empty when it can)."""
    import jax

    problems = []
    version = _version_tuple(jax.__version__)
    low, high = TESTED_JAX_VERSIONS
    if os.environ.get(ALLOW_UNTESTED_ENV, "") not in _TRUE and (
        version is None or not low <= version <= high
    ):
        tested = ".".join(map(str, low)) + ("" if low == high else " to " + ".".join(map(str, high)))
        problems.append(
            f"jax {jax.__version__} is untested (hlofuse tests jax {tested}; set {ALLOW_UNTESTED_ENV}=1)"
        )
    try:
        from jax._src import cache_key, compiler
        from jax._src.lib import xla_client
    except ImportError as error:
        return [*problems, f"cannot import the hooked jax internals: {error}"]

    target = getattr(compiler, "compile_or_get_cached", None)
    target = getattr(target, "_hlofuse_original", target)
    if not callable(target):
        problems.append("jax._src.compiler.compile_or_get_cached is missing")
    else:
        names = tuple(inspect.signature(target).parameters)[: len(EXPECTED_PARAMETERS)]
        if names != EXPECTED_PARAMETERS:
            problems.append(
                f"jax._src.compiler.compile_or_get_cached takes {names}, expected {EXPECTED_PARAMETERS}"
            )
    hook = getattr(cache_key, "custom_hook", None)
    if not callable(hook):
        problems.append("jax._src.cache_key.custom_hook is missing")
    elif any(
        p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        for p in inspect.signature(hook).parameters.values()
    ):
        problems.append("jax._src.cache_key.custom_hook now takes arguments")
    if not isinstance(getattr(xla_client.CompileOptions(), "env_option_overrides", None), list):
        problems.append("CompileOptions.env_option_overrides is no longer a list of (key, value) pairs")
    return problems


_install_lock = threading.Lock()
# (module, attribute, value before install) for every binding install() replaced.
_patched: list[tuple[Any, str, Any]] = []


def _compile_hooked() -> bool:
    from jax._src import compiler

    return hasattr(compiler.compile_or_get_cached, "_hlofuse_original")


def _cache_key_hooked() -> bool:
    from jax._src import cache_key

    hook: Any = getattr(cache_key, "custom_hook", None)
    while hook is not None:  # ours may sit anywhere in a chain of wrappers that kept a reference
        if hasattr(hook, "_hlofuse_previous"):
            return True
        hook = getattr(hook, "__wrapped__", None)
    return False


def is_installed() -> bool:
    """Whether both the compile wrapper and the cache-key hook are in place."""
    return _compile_hooked() and _cache_key_hooked()


def install() -> None:
    """Installs the compile hook; calling it again does nothing. Raises HlofuseHookError on untested jax.

    Also re-installs a part someone else replaced since (say, a later `cache_key.custom_hook = ...`).
    """
    with _install_lock:
        if is_installed():
            return
        problems = check_hook_points()
        if problems:
            raise HlofuseHookError("hlofuse cannot hook jax.jit: " + "; ".join(problems))
        from jax._src import cache_key, compiler

        if not _compile_hooked():
            original = compiler.compile_or_get_cached
            wrapper = _make_wrapper(original)
            # Patch the defining module and any module that bound the function by a from-import.
            for module in list(sys.modules.values()):
                name = getattr(module, "__name__", "")
                if not (name == "jax" or name.startswith(("jax.", "jaxlib."))):
                    continue
                if vars(module).get("compile_or_get_cached") is original:
                    _patched.append((module, "compile_or_get_cached", original))
                    module.compile_or_get_cached = wrapper  # type: ignore[attr-defined]
        if not _cache_key_hooked():
            _patched.append((cache_key, "custom_hook", cache_key.custom_hook))
            cache_key.custom_hook = _make_cache_key_hook(cache_key.custom_hook)
        logger.debug("hlofuse: compile hook installed (%d bindings)", len(_patched))


def uninstall() -> None:
    """Restores what install() replaced, where nobody has replaced it since."""
    with _install_lock:
        while _patched:
            module, attribute, before = _patched.pop()
            current = getattr(module, attribute, None)
            if (
                getattr(current, "_hlofuse_original", None) is before
                or getattr(current, "_hlofuse_previous", None) is before
            ):
                setattr(module, attribute, before)
