"""hlofuse-report: an analytical performance model of a JAX program on the host CPU, TPUs, GPUs and Trainium.

    import hlofuse.report
    rep = hlofuse.report.report(jax.jit(f), x, y, targets="host,tpu-v5e,h100")
    print(hlofuse.report.text(rep)); rep.to_json()

`report` takes a (jitted) function and its arguments, or a `jax.stages.Lowered`, or an `ir.Module`; the
command line (`hlofuse-report`, `python -m hlofuse.report`) takes any file hlofuse-opt reads. See
docs/report.md for the model and how far it is validated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hlofuse.report.hardware import DEFAULT_TARGETS, load_table
from hlofuse.report.model import Report, TargetReport, analyze
from hlofuse.report.render import compare_json, compare_text, text, to_html, to_json

__all__ = ["DEFAULT_TARGETS", "Report", "TargetReport", "analyze", "compare_json", "compare_text", "load_table",
           "module_of", "report", "text", "to_html", "to_json"]


def module_of(program: Any, *args: Any) -> Any:  # noqa: ANN401
    """The StableHLO module of a Lowered, a jitted function with `args`, a plain function with `args` (jitted
    here), or an `ir.Module` as it is."""
    from jaxlib.mlir import ir

    if isinstance(program, ir.Module):
        return program
    compiler_ir = getattr(program, "compiler_ir", None)
    if compiler_ir is not None:  # jax.stages.Lowered
        return compiler_ir("stablehlo")
    import jax

    lower = getattr(program, "lower", None)
    if lower is None:
        lower = jax.jit(program).lower
    return lower(*args).compiler_ir("stablehlo")


def report(program: Callable[..., Any] | Any, *args: Any, targets: str | list[str] | None = None,  # noqa: ANN401
           fuse: bool = True, measure: bool = False, kv_fill: float = 1.0, calibrate: bool = True,
           name: str | None = None, runs: int = 5) -> Report:
    """The report of `program` (see `module_of`) for `targets` (default: every chip in the table).

    `fuse=False` models the program as XLA runs it without hlofuse; `measure` also times it on this CPU
    (with `args` when given); `kv_fill` is the fraction of a KV cache that attention sites with kv_lengths
    read (the model cannot see the lengths)."""
    module = module_of(program, *args)
    label = name or getattr(program, "__name__", None) or type(program).__name__
    rep = analyze(module, targets, fuse=fuse, kv_fill=kv_fill, calibrate=calibrate, program=label)
    if measure:
        from hlofuse.report.measure import measure_callable, measure_module

        if args and callable(program) and getattr(program, "compiler_ir", None) is None:
            rep.measured = {"host": measure_callable(program, args, fuse=fuse, runs=runs)}
        else:
            rep.measured = {"host": measure_module(module, fuse=fuse, runs=runs)}
    return rep
