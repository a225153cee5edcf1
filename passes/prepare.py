"""hlofuse-prepare: one normal form to match.

Matches: `func.call`s of private, single-block functions (JAX outlines helpers such as `@_where` and
`@tril`, which the upstream `inline` pass leaves in place).
Emits: the callee's body inlined at each call site, unreferenced private functions erased, then
`canonicalize` and `cse`.

    %m = call @tril(%c) : (tensor<16x16xi1>) -> tensor<16x16xi1>
  becomes
    %0 = stablehlo.iota dim = 0 : tensor<16x16xi32>  ...  %m = stablehlo.select %4, %c, %5 ...
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from jax._src.lib import jax_mlir_ext
from jaxlib.mlir import ir, passmanager

from hlofuse.pipeline import ModulePass, PassState


def _symbol(op: ir.Operation) -> str:
    return ir.StringAttr(op.attributes["sym_name"]).value


def _private_single_block_funcs(module: ir.Operation) -> dict[str, ir.Operation]:
    funcs = {}
    for op in module.regions[0].blocks[0].operations:
        operation = op.operation
        if operation.name != "func.func" or "sym_visibility" not in operation.attributes:
            continue
        if ir.StringAttr(operation.attributes["sym_visibility"]).value != "private":
            continue
        blocks = list(operation.regions[0].blocks)
        if len(blocks) == 1:
            funcs[_symbol(operation)] = operation
    return funcs


def _calls_to(module: ir.Operation, callees: dict[str, ir.Operation]) -> list[ir.Operation]:
    calls: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == "func.call":
            callee = ir.FlatSymbolRefAttr(op.attributes["callee"]).value
            if callee in callees:
                calls.append(op)
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    return calls


_SYMBOL_USERS = ("stablehlo.composite", "stablehlo.custom_call")


def _referenced_symbols(module: ir.Operation) -> set[str]:
    used: set[str] = set()

    def visit(op: ir.Operation) -> ir.WalkResult:
        name = op.name
        # Plain StableHLO ops never name a symbol; skipping them keeps this walk cheap on big modules.
        if name.startswith("stablehlo.") and name not in _SYMBOL_USERS:
            return ir.WalkResult.ADVANCE
        attributes = op.attributes
        for index in range(len(attributes)):
            attr = attributes[index].attr
            if isinstance(attr, ir.FlatSymbolRefAttr):
                used.add(attr.value)
            elif isinstance(attr, ir.ArrayAttr):
                used.update(a.value for a in attr if isinstance(a, ir.FlatSymbolRefAttr))
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    return used


def inline_private_calls(module: ir.Operation) -> int:
    """Inlines calls to private single-block funcs until none is left; returns how many it inlined."""
    inlined = 0
    while True:
        callees = _private_single_block_funcs(module)
        calls = _calls_to(module, callees)
        if not calls:
            break
        for call in calls:
            callee = callees[ir.FlatSymbolRefAttr(call.attributes["callee"]).value]
            with call.location, ir.InsertionPoint(call):
                results = jax_mlir_ext.inlined_func_call(callee, list(call.operands), call.location)
            for old, new in zip(call.results, results, strict=True):
                old.replace_all_uses_with(new)
            call.erase()
            inlined += 1
    erase_unreferenced_private_funcs(module)
    return inlined


def erase_unreferenced_private_funcs(module: ir.Operation) -> None:
    """Erases private funcs nothing refers to (callers, composites), until none is left."""
    while True:
        used = _referenced_symbols(module)
        dead = [op for name, op in _private_single_block_funcs(module).items() if name not in used]
        if not dead:
            return
        for op in dead:
            op.erase()


@dataclass(frozen=True)
class PreparePass(ModulePass):
    """Inlines JAX's private helper functions, then canonicalizes and CSEs: one normal form to match."""

    name: ClassVar[str] = "hlofuse-prepare"
    summary: ClassVar[str] = "Inline private helper funcs, canonicalize and CSE"

    def run(self, module: ir.Operation, state: PassState) -> None:
        state.count("inline_private_call", inline_private_calls(module))
        cleanup = passmanager.PassManager.parse("builtin.module(canonicalize,cse)", context=module.context)
        cleanup.run(module)
