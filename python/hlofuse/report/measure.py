"""`--measure`: run the program on this CPU as the host target runs it, and time it.

A module read from a file gets random arguments of its parameter types (floats N(0, 1); integers in [0, 16),
so a length or position argument says how far a kernel reads; booleans False); a function with its own
arguments runs on those. The default pipeline lowers for the CPU (hlofuse's kernels) unless the report models
the program unfused. Times are the median of `runs` calls after warm-up calls (a fresh program's first calls
run slower), with the best (fastest) call beside it, and the median CPU time of a call (all the process's
threads): on a machine shared with other jobs the CPU time stays what the work takes while the wall time
grows.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from jaxlib.mlir import ir

_NUMPY = {"f32": "float32", "f64": "float64", "f16": "float16", "bf16": "bfloat16", "i32": "int32", "i64": "int64",
          "i16": "int16", "i8": "int8", "ui32": "uint32", "ui64": "uint64", "ui8": "uint8", "i1": "bool"}


def _time(call: Callable[[], Any], runs: int, progress: Callable[[str], None] | None = None,
          label: str = "") -> dict[str, Any]:
    return _time_interleaved({label: call}, runs, progress)[label]


def _time_interleaved(calls: dict[str, Callable[[], Any]], runs: int,
                      progress: Callable[[str], None] | None = None) -> dict[str, dict[str, Any]]:
    """Times each call `runs` times after its warm-up calls (`warm_up`), taking them in turn (A, B, A, B, ...), so
    that a load which comes and goes on a shared machine slows all of them alike. With several calls each turn
    starts with an untimed call: the timed one finds the caches as a repeated call of that program does
    (what the host model predicts), not as the other program left them. `progress` gets a line after the
    warm-up and after each round when the warm-up took a second or more."""
    import jax

    times: dict[str, list[float]] = {k: [] for k in calls}
    cpus: dict[str, list[float]] = {k: [] for k in calls}
    start = time.perf_counter()
    for call in calls.values():
        warm_up(call, progress=progress)
    warm = time.perf_counter() - start
    verbose = progress is not None and warm >= 1.0
    if verbose:
        progress(f"warm-up call{'s' if len(calls) > 1 else ''} {warm:.1f} s; timing {runs} "
                 f"call{'s' if runs > 1 else ''} of {' and '.join(k or 'the program' for k in calls)}")
    for i in range(runs):
        for name, call in calls.items():
            if len(calls) > 1:
                jax.block_until_ready(call())
            wall, cpu = time.perf_counter(), time.process_time()
            jax.block_until_ready(call())
            times[name].append(time.perf_counter() - wall)
            cpus[name].append(time.process_time() - cpu)
        if verbose:
            assert progress is not None
            done = ", ".join(f"{k + ' ' if k else ''}{times[k][-1] * 1e3:.1f} ms" for k in calls)
            progress(f"call {i + 1}/{runs}: {done} ({time.perf_counter() - start:.0f} s so far)")
    return {k: {"measured_s": statistics.median(times[k]), "best_s": min(times[k]),
                "measured_cpu_s": statistics.median(cpus[k]), "runs": runs, "times_s": times[k], "cpu_s": cpus[k]}
            for k in calls}


def warm_up(call: Callable[[], Any], budget_s: float = 1.0, max_calls: int = 10,
            progress: Callable[[str], None] | None = None) -> None:
    """Calls `call` until its time has settled: the first calls of a freshly compiled program can run 2-3x
    slower for several calls (measured: 5 calls of the demo's decode step; the cause is not pinned down,
    buffers the allocator hands out fresh until it reuses them being the likely one). At least 3 calls, then
    more while under `budget_s` seconds, at most `max_calls`; a program whose calls take seconds gets one.
    `progress` gets a line for each warm-up call that takes a second or more."""
    import jax

    start = time.perf_counter()
    for i in range(max_calls):
        t0 = time.perf_counter()
        jax.block_until_ready(call())
        took, elapsed = time.perf_counter() - t0, time.perf_counter() - start
        if progress is not None and took >= 1.0:
            progress(f"warm-up call {i + 1}: {took:.1f} s")
        if elapsed > budget_s and (i >= 2 or elapsed > 5 * budget_s):
            break


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


def compiled_call(module: ir.Module, *, fuse: bool = True, seed: int = 0) -> Callable[[], Any]:
    """`module` compiled for this CPU (after `hlofuse-default{target=cpu}` when `fuse`) with random arguments
    (`random_arguments`): a function of no arguments that runs it once."""
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
    arrays = [jax.device_put(a, jax.devices("cpu")[0]) for a in random_arguments(module, seed)]

    def call() -> Any:  # noqa: ANN401
        return executable.execute_sharded(arrays).disassemble_into_single_device_arrays()

    return call


def measure_module(module: ir.Module, *, fuse: bool = True, runs: int = 5,
                   progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Compiles `module` for this CPU (after `hlofuse-default{target=cpu}` when `fuse`) and times it."""
    result = _time(compiled_call(module, fuse=fuse), runs, progress)
    result["fused"] = fuse
    return result


def measure_pair(a: ir.Module, b: ir.Module, *, fuse: bool = True, runs: int = 5,
                 progress: Callable[[str], None] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Times two programs (`--compare --measure`) in turn, call for call, so the load on a shared machine
    falls on both alike."""
    calls = {"A": compiled_call(a, fuse=fuse), "B": compiled_call(b, fuse=fuse)}
    result = _time_interleaved(calls, runs, progress)
    for r in result.values():
        r["fused"] = fuse
    return result["A"], result["B"]


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
