"""A CPU custom call that runs a Python function on the host: how target=neuron-sim runs NKI kernels.

`jax.pure_callback` cannot be used here: its custom call names the callback by an index into the host
callbacks of the executable it was lowered in, and hlofuse-lower-kernels inlines the lowered kernel
into another module (the user's), whose executable does not carry that callback. So the kernel call is
a legacy (API_VERSION_STATUS_RETURNING_UNIFIED) CPU custom call `hlofuse_nki_host_call`, registered
once per process from a ctypes function; its backend_config is a JSON description (function name,
arguments, operand and result shapes), so the module needs no per-process state and survives the
persistent compilation cache. The function runs in the emulator or NKI's simulator on NumPy arrays.

XLA's status API (XlaCustomCallStatusSetFailure) is not exported by jaxlib, so an exception in the host
function cannot fail the execution: it is logged at ERROR level, kept in `last_errors()`, and the
result is filled with NaN (-1 for integer results: the sampler's UNCERTIFIED, which makes its wrapper
recompute those rows with the reference). Static limits are checked when the kernel is lowered, so this
is rare.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import json
import logging
import math
import threading
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import jax
import ml_dtypes
import numpy as np
from jax._src import dispatch
from jax._src.interpreters import mlir
from jax.extend.core import Primitive
from jaxlib.mlir import ir

logger = logging.getLogger("hlofuse")

TARGET = "hlofuse_nki_host_call"
_DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16), "float16": np.dtype(np.float16),
    "int32": np.dtype(np.int32), "uint8": np.dtype(np.uint8),
}  # fmt: skip
_CTYPE = ctypes.CFUNCTYPE(
    None, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_size_t, ctypes.c_void_p
)
_lock = threading.Lock()
_registered: list[Any] = []  # keeps the ctypes function alive for the process
_errors: list[str] = []


def last_errors() -> list[str]:
    """Tracebacks of host functions that failed since the last call (and forgets them)."""
    errors = list(_errors)
    _errors.clear()
    return errors


def _buffer(pointer: int, shape: Sequence[int], dtype: np.dtype) -> np.ndarray:
    count = math.prod(shape)
    raw = (ctypes.c_uint8 * (count * dtype.itemsize)).from_address(pointer)
    return np.frombuffer(raw, dtype=dtype, count=count).reshape(shape)


def _host(out: int, ins: Any, opaque: bytes, length: int, status: int) -> None:  # noqa: ANN401
    spec = json.loads(ctypes.string_at(opaque, length).decode())
    out_shape, out_dtype = spec["result"]
    result = _buffer(out, out_shape, _DTYPES[out_dtype])
    try:
        args = [_buffer(ins[i], shape, _DTYPES[dtype]).copy() for i, (shape, dtype) in enumerate(spec["operands"])]
        module_name, function_name = spec["function"].split(":")
        fn = getattr(importlib.import_module(module_name), function_name)
        value = np.asarray(fn(*args, **spec["kwargs"]))
        if value.shape != tuple(out_shape):
            raise ValueError(f"host function returned shape {value.shape}, expected {tuple(out_shape)}")
        result[...] = value.astype(result.dtype)
    except Exception:  # noqa: BLE001  (nothing can propagate through XLA; see the module docstring)
        message = traceback.format_exc()
        _errors.append(message)
        logger.error("hlofuse: NKI host call %s failed; result NaN (ints -1):\n%s", spec["function"], message)
        result[...] = -1 if np.issubdtype(result.dtype, np.integer) else np.nan


def _register() -> None:
    with _lock:
        if _registered:
            return
        function = _CTYPE(_host)
        new_capsule = ctypes.pythonapi.PyCapsule_New
        new_capsule.restype = ctypes.py_object
        new_capsule.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
        capsule = new_capsule(ctypes.cast(function, ctypes.c_void_p).value, b"xla._CUSTOM_CALL_TARGET", None)
        jax.ffi.register_ffi_target(TARGET, capsule, platform="cpu", api_version=0)
        _registered.append(function)


host_call_p = Primitive("hlofuse_nki_host_call")


def _abstract_eval(*args: Any, spec: str, shape: tuple[int, ...], dtype: np.dtype) -> jax.core.ShapedArray:  # noqa: ANN401
    return jax.core.ShapedArray(shape, dtype)


def _lower(ctx: mlir.LoweringRuleContext, *args: ir.Value, spec: str, shape: tuple[int, ...],
           dtype: np.dtype) -> Sequence[ir.Value]:  # fmt: skip
    _register()
    (aval_out,) = ctx.avals_out
    result_type = mlir.aval_to_ir_type(ctx.module_context, aval_out)
    row_major = [list(reversed(range(len(a.shape)))) for a in ctx.avals_in]
    op = mlir.custom_call(
        TARGET, result_types=[result_type], operands=list(args), backend_config=spec, api_version=3,
        has_side_effect=False, operand_layouts=row_major, result_layouts=[list(reversed(range(len(shape))))],
    )  # fmt: skip
    return op.results


host_call_p.def_impl(functools.partial(dispatch.apply_primitive, host_call_p))
host_call_p.def_abstract_eval(_abstract_eval)
mlir.register_lowering(host_call_p, _lower, platform="cpu")


def host_call(function: Callable[..., np.ndarray], args: Sequence[jax.Array], kwargs: dict[str, Any],
              result: jax.ShapeDtypeStruct) -> jax.Array:  # fmt: skip
    """`function(*numpy args, **kwargs)` run on the host inside the program; kwargs must be JSON."""
    spec = json.dumps({
        "function": f"{function.__module__}:{function.__qualname__}",
        "kwargs": kwargs,
        "operands": [[list(a.shape), np.dtype(a.dtype).name] for a in args],
        "result": [list(result.shape), np.dtype(result.dtype).name],
    }, sort_keys=True)  # fmt: skip
    for a in args:
        if np.dtype(a.dtype).name not in _DTYPES:
            raise ValueError(f"host_call passes {sorted(_DTYPES)} arrays, not {np.dtype(a.dtype).name}")
    return host_call_p.bind(*args, spec=spec, shape=tuple(result.shape), dtype=np.dtype(result.dtype))
