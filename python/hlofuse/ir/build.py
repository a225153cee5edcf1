"""Outlining: move a matched subgraph into a private function and call it through a composite.

The composite's decomposition is the original subgraph, cloned, so XLA computes exactly what the user
wrote whenever no kernel takes the composite.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func, stablehlo

from hlofuse.ir.match import defining_op

# Ops that compute from nothing: cloning them into a decomposition is always sound and cheap.
LEAF_OPS = ("stablehlo.constant", "stablehlo.iota")


class NotOutlinable(Exception):
    """The subgraph reads a value that is neither a declared input nor computable inside it."""

    def __init__(self, value: ir.Value, reason: str) -> None:
        super().__init__(reason)
        self.value = value


def backward_slice(root: ir.Value, boundaries: Mapping[ir.Value, object]) -> list[ir.Operation]:
    """Ops computing `root` from the `boundaries`, operands before users.

    Values defined outside the root's region chain, or block arguments, must be boundaries; ops with
    regions are taken whole (their bodies are cloned along with them).
    """
    order: list[ir.Operation] = []
    seen: set[ir.Operation] = set()
    stack: list[tuple[ir.Value, bool]] = [(root, False)]
    while stack:
        value, expanded = stack.pop()
        op = defining_op(value)
        if expanded:
            if op is not None and op not in seen:
                seen.add(op)
                order.append(op)
            continue
        if value in boundaries:
            continue
        if op is None:
            raise NotOutlinable(value, "reads a block argument that is not one of its inputs")
        if op in seen:
            continue
        stack.append((value, True))
        for operand in op.operands:
            if operand not in boundaries and defining_op(operand) not in seen:
                stack.append((operand, False))
    return order


def unique_symbol(module: ir.Operation, base: str) -> str:
    taken = {
        ir.StringAttr(op.operation.attributes["sym_name"]).value
        for op in module.regions[0].blocks[0].operations
        if "sym_name" in op.operation.attributes
    }
    if base not in taken:
        return base
    index = 0
    while f"{base}_{index}" in taken:
        index += 1
    return f"{base}_{index}"


def build_private_func(
    module: ir.Operation,
    base_name: str,
    arg_types: Sequence[ir.Type],
    body: Callable[[Sequence[ir.Value]], Sequence[ir.Value]],
    location: ir.Location,
) -> str:
    """Appends `func.func private @<unique>(args) -> results` to `module`; `body` emits its ops."""
    name = unique_symbol(module, base_name)
    with location, ir.InsertionPoint(module.regions[0].blocks[0]):
        # Created attached: a detached func inserted into a SymbolTable can be collected by Python.
        fn = func.FuncOp(name, (list(arg_types), []), visibility="private")
        entry = fn.add_entry_block()
        with ir.InsertionPoint(entry):
            results = list(body(list(entry.arguments)))
            func.ReturnOp(results)
        fn.attributes["function_type"] = ir.TypeAttr.get(
            ir.FunctionType.get(list(arg_types), [r.type for r in results])
        )
    return name


def clone_ops(ops: Sequence[ir.Operation], mapping: dict[ir.Value, ir.Value]) -> None:
    """Clones `ops` at the current insertion point, rewiring operands through `mapping`."""
    for op in ops:
        clone = op.clone()
        for index, operand in enumerate(clone.operands):
            if operand in mapping:
                clone.operands[index] = mapping[operand]
        for old, new in zip(op.results, clone.results, strict=True):
            mapping[old] = new


def composite(
    name: str, inputs: Sequence[ir.Value], result_types: Sequence[ir.Type], attributes: dict[str, ir.Attribute],
    decomposition: str, version: int,
) -> ir.Operation:
    result = stablehlo.composite(
        list(result_types), list(inputs), name, decomposition, 0,
        composite_attributes=ir.DictAttr.get(attributes), version=version,
    )
    return result.owner.operation


def erase_dead(ops: Sequence[ir.Operation]) -> None:
    """Erases each op of `ops` (operands before users) whose results are all unused, users first."""
    for op in reversed(ops):
        if all(not list(result.uses) for result in op.results):
            op.erase()


def decomposition_symbols(module: ir.Operation) -> set[str]:
    """Names of the functions that composites in `module` use as their decomposition."""
    names: set[str] = set()

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == "stablehlo.composite":
            names.add(ir.FlatSymbolRefAttr(op.attributes["decomposition"]).value)
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    return names


def functions(module: ir.Operation, *, skip_decompositions: bool) -> list[ir.Operation]:
    """The module's func.func ops; without the composites' decompositions (already raised) if asked."""
    skipped = decomposition_symbols(module) if skip_decompositions else set()
    return [
        op.operation for op in module.regions[0].blocks[0].operations
        if op.operation.name == "func.func"
        and ir.StringAttr(op.operation.attributes["sym_name"]).value not in skipped
    ]
