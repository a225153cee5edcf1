"""`--measure`: run the program on this CPU as the host target runs it, and time it.

A module read from a file gets random arguments of its parameter types (floats N(0, 1); integers in
[0, 16), so a length or position argument says how far a kernel reads; booleans False); a function
with its own arguments runs on those. The default pipeline lowers for the CPU (hlofuse's kernels) unless
the report models the program unfused. Times are the median of `runs` calls after one warm-up call,
with the best (fastest) call beside it, and the median CPU time of a call (all the process's threads): on a
machine shared with other jobs the CPU time stays what the work takes while the wall time grows.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from jaxlib.mlir import ir

_NUMPY = {"f32": "float32", "f64": "float64", "f16": "float16", "bf16": "bfloat16", "i32": "int32", "i64": "int64",
          "i16": "int16", "i8": "int8", "ui32": "uint32", "ui64": "uint64", "ui8": "uint8", "i1": "bool"}


def _time(call: Callable[[], Any], runs: int) -> dict[str, Any]:
    import jax

    jax.block_until_ready(call())
    times, cpus = [], []
    for _ in range(runs):
        start, cpu = time.perf_counter(), time.process_time()
        jax.block_until_ready(call())
        times.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    return {"measured_s": statistics.median(times), "best_s": min(times), "measured_cpu_s": statistics.median(cpus),
            "runs": runs, "times_s": times, "cpu_s": cpus}


def random_arguments(module: ir.Module, seed: int = 0) -> list[Any]:  # noqa: ANN401
    """Arrays for the parameters of `module`'s main."""
    import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy)
    import numpy as np

    from hlofuse.report.graph import Flattener, tensor_type

    main = Flattener(module).main()
    rng = np.random.default_rng(seed)
    out = []
    for arg in main.regions[0].blocks[0].arguments:
        shape, dtype = tensor_type(arg.type)
        name = _NUMPY.get(dtype)
        if name is None:
            raise ValueError(f"cannot make an argument of element type {dtype}")
        if dtype == "i1":
            out.append(np.zeros(shape, np.bool_))
        elif dtype.startswith(("i", "ui")):
            out.append(rng.integers(0, 16, size=shape).astype(name))
        else:
            import ml_dtypes

            np_dtype = ml_dtypes.bfloat16 if dtype == "bf16" else np.dtype(name)
            out.append(rng.standard_normal(shape).astype(np_dtype))
    return out


def measure_module(module: ir.Module, *, fuse: bool = True, runs: int = 5) -> dict[str, Any]:
    """Compiles `module` for this CPU (after `hlofuse-default{target=cpu}` when `fuse`) and times it."""
    import jax
    from jax._src import compiler
    from jax._src.lib import xla_client

    from hlofuse.ir.context import clone_module
    from hlofuse.pipeline import run_pipeline
    from hlofuse.sharding import device_count

    if device_count(module.operation) > 1:
        raise ValueError("--measure runs one-device programs only (this one is partitioned)")
    clone = clone_module(module)
    if fuse:
        from hlofuse.kernels import cpu

        cpu.register()
        run_pipeline(clone, "hlofuse-default{target=cpu}")
    client = jax.devices("cpu")[0].client
    device = client.local_devices()[0]
    options = compiler.get_compile_options(num_replicas=1, num_partitions=1, backend=client)
    executable = client.compile_and_load(clone.operation.get_asm(binary=True),
                                         executable_devices=xla_client.DeviceList((device,)),
                                         compile_options=options)
    arrays = [jax.device_put(a, jax.devices("cpu")[0]) for a in random_arguments(module)]

    def call() -> Any:  # noqa: ANN401
        return executable.execute_sharded(arrays).disassemble_into_single_device_arrays()

    result = _time(call, runs)
    result["fused"] = fuse
    return result


def measure_callable(fn: Callable[..., Any], args: tuple[Any, ...], *, fuse: bool = True,  # noqa: ANN401
                     runs: int = 5) -> dict[str, Any]:
    """Times `fn(*args)` jitted for this CPU, with the default pipeline when `fuse`."""
    import jax

    options = {"hlofuse_pipeline": "default"} if fuse else {}
    lower = getattr(fn, "lower", None)
    if lower is not None:
        compiled = lower(*args).compile(compiler_options=options) if options else lower(*args).compile()
    else:
        compiled = jax.jit(fn, compiler_options=options).lower(*args).compile()
    result = _time(lambda: compiled(*args), runs)
    result["fused"] = fuse
    return result
