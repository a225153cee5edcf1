"""Contexts and module cloning over jaxlib's bundled MLIR (with the StableHLO dialects)."""

from __future__ import annotations

from jax._src.interpreters import mlir as jax_mlir
from jaxlib.mlir import ir


def make_context() -> ir.Context:
    """A context that knows every dialect JAX emits (a bare ir.Context knows only builtin)."""
    return jax_mlir.make_ir_context()


def parse_module(source: str | bytes, context: ir.Context | None = None) -> ir.Module:
    """Parses StableHLO text or MLIR bytecode."""
    context = context or make_context()
    with context:
        return ir.Module.parse(source)


def clone_module(module: ir.Module) -> ir.Module:
    """A deep copy in the same context, so rewriting never touches the caller's module."""
    return ir.Module.parse(module.operation.get_asm(binary=True), context=module.context)
