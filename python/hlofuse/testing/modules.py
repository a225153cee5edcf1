"""Run StableHLO modules and compare their outputs: the harness behind hlofuse's differential tests.

`run_module` compiles a module with the CPU PJRT client directly (`Client.compile_and_load`), not through
`jax.jit`, so jax's compile path, and with it hlofuse's own compile hook, never touches the module: what
runs is exactly the module given. Composites are inlined by XLA; a `stablehlo.custom_call` to an FFI
target needs that target registered (`jax.ffi.register_ffi_target`) before the call.

Input recipes (`make_inputs`) are the ones test/fixtures/libraries/manifest.json stores, so tests can
regenerate a fixture's arguments without the libraries that produced it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import jax
import ml_dtypes
import numpy as np
from jax._src import compiler
from jax._src.lib import xla_client
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func

from hlofuse.ir.context import clone_module as clone_module  # re-exported for the tests
from hlofuse.ir.context import parse_module
from hlofuse.ops.attention import ATTENTION, AttentionAttrs
from hlofuse.ops.sample import SAMPLE, SampleAttrs

T = TypeVar("T")

# Element type (as MLIR prints it) -> numpy dtype name.
_ELEMENT_DTYPES = {
    "f64": "float64",
    "f32": "float32",
    "f16": "float16",
    "bf16": "bfloat16",
    "i1": "bool",
    "i8": "int8",
    "i16": "int16",
    "i32": "int32",
    "i64": "int64",
    "ui8": "uint8",
    "ui16": "uint16",
    "ui32": "uint32",
    "ui64": "uint64",
}

# dtype name -> (rtol, atol). f32: rtol 1e-5 as the contract says, with atol 1e-6 so values near zero
# (where relative error means nothing) do not fail on the last bit. bf16 has an 8-bit significand
# (eps 2**-7 = 7.8e-3) and f16 an 11-bit one (eps 9.8e-4); a kernel that accumulates in f32 and rounds
# once can differ from XLA's op-by-op rounding by a few ulps, hence ~2.5 eps for each.
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-12, 1e-12),
    "float32": (1e-5, 1e-6),
    "float16": (2.5e-3, 2.5e-3),
    "bfloat16": (2e-2, 2e-2),
}


# StableHLO text or bytecode, parsed in a context with every dialect JAX registers.
parse_module_text = parse_module


def main_func(module: ir.Module) -> func.FuncOp:
    """The module's public entry function, `@main`."""
    for op in module.body.operations:
        if op.operation.name == "func.func" and ir.StringAttr(op.attributes["sym_name"]).value == "main":
            return op
    raise ValueError("module has no func.func @main")


def dtype_name(element_type: ir.Type) -> str:
    """The numpy dtype name of an MLIR element type (`f32` -> "float32")."""
    key = str(element_type)
    if key not in _ELEMENT_DTYPES:
        raise ValueError(f"unsupported element type {key}")
    return _ELEMENT_DTYPES[key]


def tensor_spec(t: ir.Type) -> tuple[tuple[int, ...], str]:
    """(shape, dtype name) of a ranked tensor type."""
    rt = ir.RankedTensorType(t)
    return tuple(rt.shape), dtype_name(rt.element_type)


def np_dtype(name: str) -> np.dtype:
    """A numpy dtype from its name, bfloat16 included (through ml_dtypes)."""
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def run_module(module: ir.Module | str, args: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Compile `module` for the CPU and run it once on `args`; return its outputs as numpy arrays."""
    if isinstance(module, str):
        module = parse_module_text(module)
    params = main_func(module).type.inputs
    if len(params) != len(args):
        raise ValueError(f"module @main takes {len(params)} arguments, got {len(args)}")
    for i, (t, a) in enumerate(zip(params, args, strict=True)):
        shape, dtype = tensor_spec(t)
        if tuple(np.shape(a)) != shape or np.asarray(a).dtype != np_dtype(dtype):
            raise ValueError(
                f"argument {i}: module expects {shape} {dtype}, got {np.shape(a)} {np.asarray(a).dtype}"
            )
    executable = compile_for_cpu(module)
    buffers = [jax.device_put(np.asarray(a), jax.devices("cpu")[0]) for a in args]
    results = executable.execute_sharded(buffers).disassemble_into_single_device_arrays()
    return [np.asarray(r[0]) for r in results]


def compile_for_cpu(module: ir.Module) -> Any:  # noqa: ANN401  (an XLA LoadedExecutable)
    """`module` compiled by XLA for one CPU device: the executable (`.hlo_modules()` gives its optimized HLO)."""
    backend = jax.devices("cpu")[0].client
    device = backend.local_devices()[0]
    options = compiler.get_compile_options(num_replicas=1, num_partitions=1, backend=backend)
    return backend.compile_and_load(module, executable_devices=xla_client.DeviceList((device,)),
                                    compile_options=options)


def _one_input(
    rng: np.random.Generator, shape: tuple[int, ...], dtype: str, init: Mapping[str, Any]
) -> np.ndarray:
    kind = init["kind"]
    if kind == "normal":
        a = rng.standard_normal(shape, dtype=np.float32) * init.get("std", 1.0) + init.get("mean", 0.0)
    elif kind == "uniform":
        a = rng.uniform(init.get("low", 0.0), init.get("high", 1.0), shape)
    elif kind == "randint":
        a = rng.integers(init["low"], init["high"], shape)
    elif kind == "bernoulli":
        a = rng.random(shape) < init.get("p", 0.5)
    elif kind == "fill":
        a = np.full(shape, init["value"])
    elif kind == "ones":
        a = np.ones(shape)
    elif kind == "zeros":
        a = np.zeros(shape)
    else:
        raise ValueError(f"unknown input recipe kind {kind!r}")
    return np.asarray(a).astype(np_dtype(dtype))


def make_inputs(
    spec: Mapping[str, Any] | Sequence[Mapping[str, Any]], seed: int | None = None
) -> list[np.ndarray]:
    """Arguments from a manifest recipe, deterministic in `seed` (default: the entry's own "seed").

    `spec` is a manifest entry (with "inputs") or its list of inputs; each input has "shape", "dtype" and
    "init": {"kind": "normal", "mean", "std"} | {"kind": "uniform", "low", "high"} |
    {"kind": "randint", "low", "high"} (high exclusive) | {"kind": "bernoulli", "p"} |
    {"kind": "fill", "value"} | {"kind": "ones"} | {"kind": "zeros"}. All inputs draw in order from one
    `numpy.random.default_rng(seed)`.
    """
    if isinstance(spec, Mapping):
        inputs = spec["inputs"]
        seed = spec.get("seed", 0) if seed is None else seed
    else:
        inputs = spec
    rng = np.random.default_rng(0 if seed is None else seed)
    return [_one_input(rng, tuple(i["shape"]), i["dtype"], i.get("init", {"kind": "normal"})) for i in inputs]


def calls_sampling_kernel(hlo: str, form: str) -> bool:
    """Whether optimized HLO text calls the CPU sampling kernel as a fused `form` must: its sampler
    (`hlofuse_sample`), or for a form the program draws itself (`DRAWN_BY_THE_PROGRAM`) the kernel's top-k or sort."""
    from hlofuse.kernels.cpu.sampling import DRAWN_BY_THE_PROGRAM

    target = r"hlofuse_sample\w*" if form in DRAWN_BY_THE_PROGRAM else "hlofuse_sample"
    return re.search(f'custom_call_target="{target}"', hlo) is not None


def count_composites(module: ir.Module | ir.Operation, name: str | None = "hlofuse.attention") -> int:
    """How many `stablehlo.composite` ops named `name` (any name if None) sit anywhere in `module`."""
    op = module.operation if isinstance(module, ir.Module) else module
    found = 0

    def visit(o: ir.Operation) -> ir.WalkResult:
        nonlocal found
        if o.name == "stablehlo.composite":
            if name is None or ir.StringAttr(o.attributes["name"]).value == name:
                found += 1
        return ir.WalkResult.ADVANCE

    op.walk(visit)
    return found


def assert_outputs_close(
    expected: Sequence[np.ndarray],
    actual: Sequence[np.ndarray],
    *,
    rtol: float | None = None,
    atol: float | None = None,
) -> None:
    """Assert two output lists match: same shapes and dtypes, NaN where NaN, infinities equal, and
    finite values within the dtype's tolerance (`TOLERANCES`; exact for integers and bools).
    `rtol`/`atol` override the dtype defaults."""
    if len(expected) != len(actual):
        raise AssertionError(f"output count differs: expected {len(expected)}, got {len(actual)}")
    for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
        e, a = np.asarray(e), np.asarray(a)
        if e.shape != a.shape or e.dtype != a.dtype:
            raise AssertionError(f"output {i}: expected {e.shape} {e.dtype}, got {a.shape} {a.dtype}")
        if e.dtype.name not in TOLERANCES:
            np.testing.assert_array_equal(a, e, err_msg=f"output {i}")
            continue
        r, t = TOLERANCES[e.dtype.name]
        e64, a64 = e.astype(np.float64), a.astype(np.float64)
        nan_e, nan_a = np.isnan(e64), np.isnan(a64)
        if not np.array_equal(nan_e, nan_a):
            raise AssertionError(
                f"output {i}: NaN positions differ ({int(nan_e.sum())} expected, "
                f"{int(nan_a.sum())} actual, {int((nan_e != nan_a).sum())} mismatched)"
            )
        np.testing.assert_allclose(
            a64,
            e64,
            rtol=r if rtol is None else rtol,
            atol=t if atol is None else atol,
            equal_nan=True,
            err_msg=f"output {i} ({e.dtype.name})",
        )


def _composite_attrs(module: ir.Module | ir.Operation, name: str, parse: Callable[[ir.Attribute], T]) -> list[T]:
    """`parse` of the attributes of every `name` composite in `module`, in walk order."""
    operation = module.operation if isinstance(module, ir.Module) else module
    found: list[T] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == "stablehlo.composite" and ir.StringAttr(op.attributes["name"]).value == name:
            found.append(parse(op.attributes["composite_attributes"]))
        return ir.WalkResult.ADVANCE

    operation.walk(visit)
    return found


def attention_attrs(module: ir.Module | ir.Operation) -> list[AttentionAttrs]:
    """The attributes of every `hlofuse.attention` composite in `module`, in walk order."""
    return _composite_attrs(module, ATTENTION, AttentionAttrs.from_ir)


def sample_attrs(module: ir.Module | ir.Operation) -> list[SampleAttrs]:
    """The attributes of every `hlofuse.sample` composite in `module`, in walk order."""
    return _composite_attrs(module, SAMPLE, SampleAttrs.from_ir)
