"""The roles of an attention site's dims: batch, kv heads, query groups, query, key, head dims.

Given the two dots of `softmax(stages(q·kᵀ)) · v` and the layout ops between them, every dim of every
value on the site gets labels of logical factors (hlofuse.ir.dims), however the code writes them:
batch and heads folded into one dim around each dot (PyTorch's `bmm`), several batch dims in any order,
a single kv head whose dim was squeezed away, 5-D grouped queries, K/V repeated per group by broadcast
and reshape. Then each factor gets its role from what the program does with it:

- H: contracted by the q·k dot.  S: reduced by the softmax and contracted by the P·V dot.
- D: the free dims of v.
- G (query groups): factors that q has and K and V do not: q's free factors other than the query
  positions, and batch factors that K and V only get by a broadcast (a repeat per group).
- T: the query positions: q's free factor that a mask's iota counts along, else the one beside the key
  dim in the logits (a size-1 dim before it and none after means a single query position), else its
  major-most one.
- B and K: the batch factors that K and V have too. A factor merged directly before a group factor
  somewhere (heads = kv heads x groups) is a kv head; of the others, the batch is the one that leads
  q's source (else the q·k dot's first batch dim), and the rest are kv heads.

Rows of one (batch, head) pair are independent and every query row of a kv head's group sees the same
keys, so any assignment that keeps these facts computes the same attention; the rules above only pick
the one the program means (which the masks and lengths then read along B, T and S).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from hlofuse.ir.dims import LAYOUT_OPS, DimsError, Factors
from hlofuse.ir.layout import Label, Labels, static_shape
from hlofuse.ir.match import constant_scalar, defining_op

ROLES = ("B", "K", "G", "T", "S", "H", "D")
_ELEMENTWISE_LIMIT = 256  # ops visited when a mask or bias operand is walked for refinements


@dataclass(frozen=True)
class SiteOps:
    """What the dims analysis reads of a site."""

    qk_dot: ir.Operation
    stage_outputs: Sequence[ir.Value]  # dot -> softmax input, each an elementwise or layout op's result
    stage_operands: Sequence[ir.Value]  # bias and mask operands of the stages (walked for refinements)
    reduce_dim: int  # the softmax's dim, on the softmax input
    p_path: Sequence[ir.Operation]  # layout ops from the softmax output to the P·V dot's operand
    pv_dot: ir.Operation
    p_operand: ir.Value


@dataclass(frozen=True)
class Source:
    """A dot operand traced back through single-use layout ops (and, for q and k, constant scales)."""

    value: ir.Value
    labels: Labels
    scale: float
    ops: tuple[ir.Operation, ...]


@dataclass
class AttentionDims:
    """Labels over role-named atoms (`roles[r]` lists role r's atoms, major to minor; sizes per atom)."""

    sizes: dict[str, int]
    roles: dict[str, tuple[str, ...]]
    qk_out: Labels
    pv_out: Labels
    q: Source
    k: Source
    v: Source

    def size(self, role: str) -> int:
        n = 1
        for atom in self.roles[role]:
            n *= self.sizes[atom]
        return n


def analyze_dims(site: SiteOps) -> AttentionDims:
    """Raises DimsError with the reason when the site's dims do not fit attention."""
    factors = Factors()
    return factors.fixpoint(lambda: _analyze(site, factors))


# ----- one run of the analysis (raises Refine when an atom must be cut) --------------------------


@dataclass
class _Run:
    factors: Factors
    qk_out: Labels = ()
    logits: Labels = ()
    q_side: int = 0
    q_labels: Labels = ()
    k_labels: Labels = ()
    batch_atoms: list[str] = field(default_factory=list)  # in the dot's batch dims' order
    first_batch_atoms: tuple[str, ...] = ()  # those of its first batch dim
    contract_atoms: list[str] = field(default_factory=list)
    q_free: list[str] = field(default_factory=list)
    key_atoms: list[str] = field(default_factory=list)
    iota_atoms: set[str] = field(default_factory=set)  # atoms an iota in a mask or bias counts along


def _analyze(site: SiteOps, factors: Factors) -> AttentionDims:
    run = _Run(factors)
    _label_qk_dot(site.qk_dot, run)
    run.logits = _follow_stages(site, run)
    _find_key_side(site, run)
    p_labels = factors.forward_all(run.logits, site.p_path)
    v_labels, pv_out = _label_pv_dot(site, p_labels, run)
    q_value, k_value = site.qk_dot.operands[run.q_side], site.qk_dot.operands[1 - run.q_side]
    q = _source(q_value, run.q_labels, factors, scales=True)
    k = _source(k_value, run.k_labels, factors, scales=True)
    v_value = site.pv_dot.operands[1 if site.p_operand == site.pv_dot.operands[0] else 0]
    v = _source(v_value, v_labels, factors, scales=False)
    d_atoms = [a for a in factors.atoms_of(v_labels) if a not in run.key_atoms and a not in run.batch_atoms]
    roles = _roles(run, q, k, v, d_atoms)
    return _renamed(run, roles, pv_out, q, k, v)


def _label_qk_dot(dot: ir.Operation, run: _Run) -> None:
    dims = stablehlo.DotDimensionNumbers(dot.attributes["dot_dimension_numbers"])
    lhs_shape, rhs_shape = _shape(dot.operands[0]), _shape(dot.operands[1])
    factors = run.factors
    lhs: list[Label] = [()] * len(lhs_shape)
    rhs: list[Label] = [()] * len(rhs_shape)
    batch = []
    for a, b in zip(dims.lhs_batching_dimensions, dims.rhs_batching_dimensions, strict=True):
        lhs[a] = rhs[b] = factors.label(lhs_shape[a], "b")
        batch.append(lhs[a])
    for a, b in zip(dims.lhs_contracting_dimensions, dims.rhs_contracting_dimensions, strict=True):
        lhs[a] = rhs[b] = factors.label(lhs_shape[a], "h")
        run.contract_atoms += list(lhs[a])
    used_l = set(dims.lhs_batching_dimensions) | set(dims.lhs_contracting_dimensions)
    used_r = set(dims.rhs_batching_dimensions) | set(dims.rhs_contracting_dimensions)
    lhs_free = [d for d in range(len(lhs_shape)) if d not in used_l]
    rhs_free = [d for d in range(len(rhs_shape)) if d not in used_r]
    for d in lhs_free:
        lhs[d] = factors.label(lhs_shape[d], "l")
    for d in rhs_free:
        rhs[d] = factors.label(rhs_shape[d], "r")
    run.batch_atoms = factors.atoms_of(tuple(batch))
    run.first_batch_atoms = batch[0] if batch else ()
    run.qk_out = tuple(batch) + tuple(lhs[d] for d in lhs_free) + tuple(rhs[d] for d in rhs_free)
    run.q_labels, run.k_labels = tuple(lhs), tuple(rhs)
    run.q_free = factors.atoms_of(tuple(lhs[d] for d in lhs_free))
    run.key_atoms = factors.atoms_of(tuple(rhs[d] for d in rhs_free))


def _follow_stages(site: SiteOps, run: _Run) -> Labels:
    labels = run.qk_out
    operands = set(site.stage_operands)
    for value in site.stage_outputs:
        op = defining_op(value)
        assert op is not None
        if op.name in LAYOUT_OPS:
            labels = run.factors.forward(op, labels)
        for operand in op.operands:
            if operand in operands:
                run.iota_atoms |= _refine_through(operand, labels, run.factors)
    return labels


def _refine_through(value: ir.Value, labels: Labels, factors: Factors) -> set[str]:
    """Walks a bias or mask operand back through elementwise and layout ops, so that the reshapes on its
    way cut the site's atoms too (then the mask analysis can follow it); returns the atoms its iotas count
    along (a causal mask's iotas name the query and key dims)."""
    stack, seen, iotas = [(value, labels)], 0, set()
    while stack and seen < _ELEMENTWISE_LIMIT:
        value, labels = stack.pop()
        seen += 1
        op = defining_op(value)
        if op is not None and op.name == "stablehlo.iota":
            iotas |= set(labels[ir.IntegerAttr(op.attributes["iota_dimension"]).value])
        if op is None or not op.operands:
            continue
        try:
            if op.name in LAYOUT_OPS:
                stack.append((op.operands[0], factors.backward(op, labels)))
            elif all(static_shape(o) == static_shape(value) for o in op.operands):
                stack += [(o, labels) for o in op.operands]
        except DimsError:
            continue
    return iotas


def _find_key_side(site: SiteOps, run: _Run) -> None:
    """The softmax reduces the key's free dims: that names which dot operand is k."""
    reduced = list(run.logits[site.reduce_dim]) if site.reduce_dim < len(run.logits) else []
    lhs_free, rhs_free = run.q_free, run.key_atoms
    if reduced and set(reduced) == set(rhs_free):
        run.q_side = 0
    elif reduced and set(reduced) == set(lhs_free):
        run.q_side = 1
        run.q_free, run.key_atoms = rhs_free, lhs_free
        run.q_labels, run.k_labels = run.k_labels, run.q_labels
    else:
        raise DimsError("the softmax does not reduce over the key's free dims of the q·k dot")
    if len(run.key_atoms) != 1:
        raise DimsError("the key positions are spread over several dims")


def _label_pv_dot(site: SiteOps, p_labels: Labels, run: _Run) -> tuple[Labels, Labels]:
    dot, factors = site.pv_dot, run.factors
    dims = stablehlo.DotDimensionNumbers(dot.attributes["dot_dimension_numbers"])
    p_is_lhs = site.p_operand == dot.operands[0]
    p_batch = list(dims.lhs_batching_dimensions if p_is_lhs else dims.rhs_batching_dimensions)
    v_batch = list(dims.rhs_batching_dimensions if p_is_lhs else dims.lhs_batching_dimensions)
    p_contract = list(dims.lhs_contracting_dimensions if p_is_lhs else dims.rhs_contracting_dimensions)
    v_contract = list(dims.rhs_contracting_dimensions if p_is_lhs else dims.lhs_contracting_dimensions)
    if factors.atoms_of(tuple(p_labels[d] for d in p_contract)) != run.key_atoms:
        raise DimsError("the P·V dot does not contract the key dim")
    v_shape = _shape(dot.operands[1 if p_is_lhs else 0])
    v_labels: list[Label] = [()] * len(v_shape)
    for p_dim, v_dim in zip(p_batch + p_contract, v_batch + v_contract, strict=True):
        v_labels[v_dim] = p_labels[p_dim]
    v_free = [d for d in range(len(v_shape)) if d not in v_batch + v_contract]
    for d in v_free:
        v_labels[d] = factors.label(v_shape[d], "d")
    p_free = [d for d in range(len(p_labels)) if d not in p_batch + p_contract]
    free = [p_labels[d] for d in p_free]
    v_out = [v_labels[d] for d in v_free]
    pv_out = [p_labels[d] for d in p_batch] + (free + v_out if p_is_lhs else v_out + free)
    return tuple(v_labels), tuple(pv_out)


def _source(value: ir.Value, labels: Labels, factors: Factors, *, scales: bool) -> Source:
    """Back from a dot operand through layout ops that keep the element type, and (for q and k, where
    nothing else uses the scaled value) multiplies or divides by a positive constant, which scale the
    logits."""
    scale, ops = 1.0, []
    while True:
        op = defining_op(value)
        if op is None:
            break
        if op.name in LAYOUT_OPS and not _changes_type(op):
            # Data movement may be shared (two layers over one repeated K/V): the site clones it.
            labels, inner = factors.backward(op, labels), op.operands[0]
        elif scales and len(list(value.uses)) == 1 and (scaled := _scaled_operand(op)) is not None:
            factor, inner = scaled
            scale *= factor
        else:
            break
        ops.append(op)
        value = inner
    return Source(value, labels, scale, tuple(ops))


def _changes_type(op: ir.Operation) -> bool:
    return op.name == "stablehlo.convert" and str(op.operands[0].type) != str(op.results[0].type)


def _scaled_operand(op: ir.Operation) -> tuple[float, ir.Value] | None:
    """(c, x) for `x * c`, `c * x` or `x / c` with c a positive constant."""
    if op.name not in ("stablehlo.multiply", "stablehlo.divide") or len(op.operands) != 2:
        return None
    x, c = op.operands[0], constant_scalar(op.operands[1])
    if c is None and op.name == "stablehlo.multiply":
        x, c = op.operands[1], constant_scalar(op.operands[0])
    if c is None or c <= 0 or constant_scalar(x) is not None:
        return None
    return (c if op.name == "stablehlo.multiply" else 1.0 / c), x


# ----- roles ---------------------------------------------------------------------------------------


def _present(source: Source) -> set[str]:
    return {a for label in source.labels for a in label}


def _adjacent_pairs(*sources: Source) -> set[tuple[str, str]]:
    """(major, minor) atoms that sit next to each other in one dim of a source."""
    return {(label[i], label[i + 1]) for s in sources for label in s.labels for i in range(len(label) - 1)}


def _roles(run: _Run, q: Source, k: Source, v: Source, d_atoms: list[str]) -> dict[str, list[str]]:
    in_k, in_v = _present(k), _present(v)
    groups, kv_batch = [], []
    for atom in run.batch_atoms:
        if (atom in in_k) != (atom in in_v):
            raise DimsError("k and v are repeated differently across the heads")
        (kv_batch if atom in in_k else groups).append(atom)
    pairs = _adjacent_pairs(q, k, v)
    free = list(run.q_free)
    grouped = [a for a in free if any((b, a) in pairs for b in kv_batch)]
    rest = [a for a in free if a not in grouped]
    query = _query_atom(run, rest)
    groups += grouped + [a for a in rest if a != query]
    kv_heads = [a for a in kv_batch if any((a, g) in pairs for g in groups)]
    others = [a for a in kv_batch if a not in kv_heads]
    batch = _batch_atom(q, run, others)
    kv_heads += [a for a in others if a != batch]
    kv_heads.sort(key=run.batch_atoms.index)
    return {"B": [batch] if batch else [], "K": kv_heads, "G": groups, "T": [query] if query else [],
            "S": list(run.key_atoms), "H": list(run.contract_atoms), "D": d_atoms}


def _batch_atom(q: Source, run: _Run, candidates: list[str]) -> str | None:
    """The batch: the candidate that leads q's source (a leading size-1 dim there means batch 1), else the
    one that leads the q·k dot's first batch dim."""
    if not candidates:
        return None
    if q.labels and q.labels[0] and q.labels[0][0] in candidates:
        return q.labels[0][0]
    if q.labels and not q.labels[0] and len(q.labels) == 4:
        return None  # (1, T, N, H) or (1, N, T, H): a batch of one
    return candidates[0] if candidates[0] in run.first_batch_atoms else None


def _query_atom(run: _Run, candidates: list[str]) -> str | None:
    """The query positions: the candidate a mask's iota indexes, else the one beside the key dim of the
    logits (before it, else after it; a size-1 dim before it and none after means one query position, as
    in a decode step), else the major-most candidate."""
    if not candidates:
        return None
    indexed = [a for a in candidates if a in run.iota_atoms]
    if len(indexed) == 1:
        return indexed[0]
    logits = run.logits
    key_dim = next(i for i, label in enumerate(logits) if run.key_atoms[0] in label)
    before = [a for a in logits[key_dim - 1] if a in candidates] if key_dim > 0 else []
    after = [a for a in logits[key_dim + 1] if a in candidates] if key_dim + 1 < len(logits) else []
    if before or after:
        return before[-1] if before else after[0]
    if key_dim > 0 and logits[key_dim - 1] == ():
        return None
    return _major_most(logits, candidates)


def _major_most(labels: Labels, atoms: list[str]) -> str | None:
    order = [a for label in labels for a in label]
    ranked = sorted(atoms, key=lambda a: order.index(a) if a in order else len(order))
    return ranked[0] if ranked else None


def _renamed(run: _Run, roles: dict[str, list[str]], pv_out: Labels, q: Source, k: Source,
             v: Source) -> AttentionDims:
    names: dict[str, str] = {}
    for role, atoms in roles.items():
        if role in ("B", "T", "S") and len(atoms) > 1:
            raise DimsError(f"the {role} role is spread over several dims")
        for i, atom in enumerate(atoms):
            names[atom] = role if i == 0 else f"{role}{i}"
    sizes = {names[a]: n for a, n in run.factors.sizes.items() if a in names}
    for role in ROLES:
        sizes.setdefault(role, 1)

    def rename(labels: Labels) -> Labels:
        try:
            return tuple(tuple(names[a] for a in label) for label in labels)
        except KeyError as missing:
            raise DimsError(f"a dim of the site has no attention role ({missing})") from None

    out = rename(pv_out)
    expected = {names[a] for role in "BKGTD" for a in roles[role]}
    if {a for label in out for a in label} != expected:
        raise DimsError("the P·V dot's output mixes roles the kernels cannot produce")
    return AttentionDims(
        sizes=sizes, roles={r: tuple(names[a] for a in roles[r]) for r in ROLES}, qk_out=rename(run.qk_out),
        pv_out=out, q=Source(q.value, rename(q.labels), q.scale, q.ops),
        k=Source(k.value, rename(k.labels), k.scale, k.ops), v=Source(v.value, rename(v.labels), v.scale, v.ops))


def _shape(value: ir.Value) -> tuple[int, ...]:
    shape = static_shape(value)
    if shape is None:
        raise DimsError("dynamic shapes are not supported")
    return shape


__all__ = ["ROLES", "AttentionDims", "SiteOps", "Source", "analyze_dims"]
