"""The StableHLO ops a traced function's lowering must hold, read from its jaxpr before lowering it.

The sampling pass lowers a reference function per candidate form at each site's shape (a tenth of a second each)
and keeps the templates whose ops all occur in the program. Most candidates fail that test for an op that one of
their primitives lowers to one for one: a sort, a scan's while loop, a scatter back to vocabulary order, a
transpose. Their jaxpr, which the lowering needs anyway, says so at a twentieth of the cost.

A primitive implies its op only where no simplification can take the op away: it is live (a result reaches an
output), it reads the function's arguments (an op on constants folds; an indexing op must read them through its
indices, as one at constant indices may become a slice), its op is no identity at these shapes (a transpose that
moves only unit dims is a reshape, a reverse of unit dims is its operand, a scan unrolled whole is no loop), and no
normal form of hlofuse-prepare rewrites it: a gather may be a take along an argsort, read as the sort's output or
put back by one; a concatenate may be a shift, made a pad; a scatter into the result of a concatenate (or of a call:
`jnp.roll`) may set one of its parts, and one at indices computed from a sort (or a call's result) may put values
back in id order (so neither a gather nor a concatenate implies its op, nor such a scatter); a reverse read by an
indexing op may be read at the mirrored place (`jnp.sort(x)[:, ::-1][:, k - 1]` is `jnp.sort(x)[:, -k]`). The
branches of a `cond` imply nothing (hlofuse-prepare inlines the taken one), nor do a loop's bodies (the loop itself
does).
test_sampling_templates checks that every template holds the ops its jaxpr implies.
"""

from __future__ import annotations

from jax.extend import core

__all__ = ["IMPLIED_OP", "required_ops"]

# A primitive, and the op its lowering emits on every platform.
IMPLIED_OP = {
    "sort": "stablehlo.sort",
    "transpose": "stablehlo.transpose",
    "scatter": "stablehlo.scatter",
    "scatter-add": "stablehlo.scatter",
    "scatter_add": "stablehlo.scatter",
    "rev": "stablehlo.reverse",
    "while": "stablehlo.while",
    "scan": "stablehlo.while",
    "dynamic_slice": "stablehlo.dynamic_slice",
}

# Indexing primitives: their operands from the first index on.
_INDICES = {"scatter": 1, "scatter-add": 1, "scatter_add": 1, "dynamic_slice": 1}

# Call-like primitives whose body is lowered in place (inlined by hlofuse-prepare where JAX outlines it).
_CALLS = ("pjit", "jit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call")


def _body(eqn: core.JaxprEqn) -> core.Jaxpr | None:
    for name in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        body = eqn.params.get(name)
        if body is not None:
            return body.jaxpr if isinstance(body, core.ClosedJaxpr) else body
    return None


def _is_identity(eqn: core.JaxprEqn) -> bool:
    """Whether the op is its operand (up to a reshape) at these shapes, so canonicalization may drop it."""
    name = eqn.primitive.name
    if name == "transpose":
        shape = eqn.invars[0].aval.shape
        moved = [d for d in eqn.params["permutation"] if shape[d] != 1]
        return moved == sorted(moved)
    if name == "rev":
        return all(eqn.invars[0].aval.shape[d] == 1 for d in eqn.params["dimensions"])
    if name == "scan":
        unroll = eqn.params.get("unroll", 1)
        return eqn.params["length"] <= 1 or unroll is True or int(unroll) >= eqn.params["length"]
    return False


def _live(jaxpr: core.Jaxpr, outputs: list[bool] | None) -> list[tuple[core.JaxprEqn, list[bool]]]:
    """The equations with a result that reaches one of the `outputs` (all where None), in order, each with which
    of its results do."""
    needed = {v for i, v in enumerate(jaxpr.outvars) if isinstance(v, core.Var) and (outputs is None or outputs[i])}
    live = []
    for eqn in reversed(jaxpr.eqns):
        results = [v in needed for v in eqn.outvars]
        if any(results):
            live.append((eqn, results))
            needed.update(v for v in eqn.invars if isinstance(v, core.Var))
    return live[::-1]


def _indexed(eqn: core.JaxprEqn, jaxpr: core.Jaxpr) -> bool:
    """Whether an indexing op (a slice, a dynamic_slice, a gather) may read a result of `eqn`: one of this jaxpr
    does, or the result leaves it (a call's body: `jnp.sort(x, descending=True)`'s reverse, indexed by the caller)."""
    results = set(eqn.outvars)
    return any(isinstance(v, core.Var) and v in results for v in jaxpr.outvars) or any(
        other.primitive.name in ("slice", "dynamic_slice", "gather")
        and any(isinstance(v, core.Var) and v in results for v in other.invars) for other in jaxpr.eqns)


def _may_be_normalised_away(scatter: core.JaxprEqn, producers: dict[core.Var, core.JaxprEqn]) -> bool:
    """Whether hlofuse-prepare may rewrite a scatter away: it sets into a concatenate's (or a call's) result, or its
    indices come from a sort or a call (within this jaxpr, through any ops)."""
    into = producers.get(scatter.invars[0])
    if into is not None and into.primitive.name in ("concatenate", *_CALLS):
        return True
    pending, seen = [v for v in scatter.invars[1:2] if isinstance(v, core.Var)], set()
    while pending:
        var = pending.pop()
        eqn = producers.get(var)
        if eqn is None or id(eqn) in seen:
            continue
        seen.add(id(eqn))
        if eqn.primitive.name in ("sort", *_CALLS):
            return True
        pending.extend(v for v in eqn.invars if isinstance(v, core.Var))
    return False


def required_ops(jaxpr: core.Jaxpr, reads: list[bool] | None = None, outputs: list[bool] | None = None
                 ) -> frozenset[str]:
    """The ops every lowering of `jaxpr` holds: `reads` says which of its inputs carry the function's arguments,
    `outputs` which of its results are used (all where None)."""
    carried = {v for i, v in enumerate(jaxpr.invars) if reads is None or reads[i]}
    producers = {v: eqn for eqn in jaxpr.eqns for v in eqn.outvars}
    ops: set[str] = set()
    for eqn, results in _live(jaxpr, outputs):
        operands = [isinstance(v, core.Var) and v in carried for v in eqn.invars]
        if not any(operands):
            continue
        carried.update(eqn.outvars)
        name, body = eqn.primitive.name, _body(eqn)
        if name in _CALLS and body is not None:
            ops |= required_ops(body, operands, results)
        elif name in IMPLIED_OP and any(operands[_INDICES.get(name, 0):]) and not _is_identity(eqn) and not (
                IMPLIED_OP[name] == "stablehlo.scatter" and _may_be_normalised_away(eqn, producers)) and not (
                name == "rev" and _indexed(eqn, jaxpr)):
            ops.add(IMPLIED_OP[name])
    return frozenset(ops)
