"""Dimension roles: which logical axis (batch, heads, query, key, ...) each tensor dim carries.

A dim's label is a tuple of atomic roles, major to minor: `("K", "G")` is a heads dim that packs kv
heads and query groups, as `reshape (B,T,N,H) -> (B,T,K,G,H)` shows. Atoms of size 1 are never kept,
so a size-1 dim has the label `()`. Labels move through transpose, reshape, convert and
broadcast_in_dim, forwards and backwards, and `relayout` emits the reshape/transpose/broadcast that
turns a labelled tensor into any other labelled layout.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

Label = tuple[str, ...]
Labels = tuple[Label, ...]
Sizes = Mapping[str, int]


def static_shape(value: ir.Value) -> tuple[int, ...] | None:
    """The shape of a ranked, fully static tensor, else None."""
    vtype = value.type
    if not isinstance(vtype, ir.RankedTensorType) or not vtype.has_static_shape:
        return None
    return tuple(vtype.shape)


def element_type(value: ir.Value) -> ir.Type:
    return ir.RankedTensorType(value.type).element_type


def label_size(label: Label, sizes: Sizes) -> int:
    return math.prod(sizes[atom] for atom in label)


def normalize(labels: Sequence[Label], sizes: Sizes) -> Labels:
    """Drops atoms of size 1: they carry no data and may sit anywhere."""
    return tuple(tuple(atom for atom in label if sizes[atom] != 1) for label in labels)


def consistent(labels: Labels, shape: Sequence[int], sizes: Sizes) -> bool:
    return len(labels) == len(shape) and all(label_size(lb, sizes) == n for lb, n in zip(labels, shape, strict=True))


def regroup(labels: Labels, shape: Sequence[int], sizes: Sizes) -> Labels | None:
    """Labels for `shape` holding the same row-major data as `labels` (a reshape), or None."""
    atoms = [atom for label in labels for atom in label]
    result: list[Label] = []
    position = 0
    for n in shape:
        taken: list[str] = []
        product = 1
        while product < n and position < len(atoms):
            taken.append(atoms[position])
            product *= sizes[atoms[position]]
            position += 1
        if product != n:
            return None
        result.append(tuple(taken))
    return tuple(result) if position == len(atoms) else None


def forward(op: ir.Operation, in_labels: Labels, sizes: Sizes) -> Labels | None:
    """Labels of a layout op's result from its (first) operand's labels; None if not a layout op."""
    name = op.name
    out_shape = static_shape(op.results[0])
    if out_shape is None:
        return None
    if name == "stablehlo.convert":
        return in_labels
    if name == "stablehlo.transpose":
        perm = list(ir.DenseI64ArrayAttr(op.attributes["permutation"]))
        return tuple(in_labels[p] for p in perm)
    if name == "stablehlo.reshape":
        return regroup(in_labels, out_shape, sizes)
    if name == "stablehlo.broadcast_in_dim" and is_unit_broadcast(op):
        # Only inserts size-1 dims: a reshape in disguise (jnp.matmul writes unit batch dims this way).
        return broadcast_labels(op, in_labels)
    return None


def broadcast_labels(op: ir.Operation, in_labels: Labels) -> Labels:
    """A broadcast_in_dim's result labels: operand dims keep theirs, added dims get `()` (no variation)."""
    dims = list(ir.DenseI64ArrayAttr(op.attributes["broadcast_dimensions"]))
    labels: list[Label] = [()] * len(ir.RankedTensorType(op.results[0].type).shape)
    for in_dim, out_dim in enumerate(dims):
        labels[out_dim] = in_labels[in_dim]
    return tuple(labels)


def is_unit_broadcast(op: ir.Operation) -> bool:
    """A broadcast_in_dim that keeps every operand dim as is and adds only dims of size 1."""
    in_shape, out_shape = static_shape(op.operands[0]), static_shape(op.results[0])
    if in_shape is None or out_shape is None:
        return False
    dims = list(ir.DenseI64ArrayAttr(op.attributes["broadcast_dimensions"]))
    return dims == sorted(dims) and all(in_shape[i] == out_shape[d] for i, d in enumerate(dims)) and all(
        out_shape[d] == 1 for d in range(len(out_shape)) if d not in dims
    )


def backward(op: ir.Operation, out_labels: Labels, sizes: Sizes) -> Labels | None:
    """Labels of a layout op's (first) operand from its result's labels; None if not a layout op.

    Through broadcast_in_dim, an operand dim of size 1 that is broadcast gets `()`: the operand does
    not vary along that role.
    """
    name = op.name
    in_shape = static_shape(op.operands[0])
    if in_shape is None:
        return None
    if name == "stablehlo.convert":
        return out_labels
    if name == "stablehlo.transpose":
        perm = list(ir.DenseI64ArrayAttr(op.attributes["permutation"]))
        labels: list[Label] = [()] * len(perm)
        for out_dim, in_dim in enumerate(perm):
            labels[in_dim] = out_labels[out_dim]
        return tuple(labels)
    if name == "stablehlo.reshape":
        return regroup(out_labels, in_shape, sizes)
    if name == "stablehlo.broadcast_in_dim":
        dims = list(ir.DenseI64ArrayAttr(op.attributes["broadcast_dimensions"]))
        out_shape = static_shape(op.results[0])
        if out_shape is None:
            return None
        return tuple(
            out_labels[d] if in_shape[i] == out_shape[d] else () for i, d in enumerate(dims)
        )
    return None


def relayout(value: ir.Value, src: Labels, dst: Labels, sizes: Sizes) -> ir.Value:
    """Emits reshape/transpose/broadcast at the current insertion point: `src`-labelled -> `dst`.

    Every atom of `src` must appear in `dst`; atoms only in `dst` are broadcast.
    """
    etype = element_type(value)
    src_atoms = [atom for label in src for atom in label]
    dst_atoms = [atom for label in dst for atom in label]
    missing = set(src_atoms) - set(dst_atoms)
    if missing or len(set(dst_atoms)) != len(dst_atoms):
        raise ValueError(f"cannot relayout {src} to {dst}")
    atomic_shape = [sizes[a] for a in src_atoms]
    current = _reshape(value, atomic_shape, etype)
    kept = [a for a in dst_atoms if a in src_atoms]
    perm = [src_atoms.index(a) for a in kept]
    if perm != sorted(perm):
        current = stablehlo.transpose(current, perm)
    if len(kept) != len(dst_atoms):
        full_shape = [sizes[a] for a in dst_atoms]
        dims = [dst_atoms.index(a) for a in kept]
        current = stablehlo.broadcast_in_dim(ir.RankedTensorType.get(full_shape, etype), current, dims)
    return _reshape(current, [label_size(label, sizes) for label in dst], etype)


def _reshape(value: ir.Value, shape: Sequence[int], etype: ir.Type) -> ir.Value:
    if list(static_shape(value) or ()) == list(shape):
        return value
    return stablehlo.reshape(ir.RankedTensorType.get(list(shape), etype), value)


def broadcast_scalar(value: float | int | bool, like: ir.Value) -> ir.Value:
    """A splat constant of `like`'s type."""
    rtype = ir.RankedTensorType(like.type)
    array = np.full(rtype.shape, value, dtype=_numpy_dtype(rtype.element_type))
    return stablehlo.constant(ir.DenseElementsAttr.get(array, type=rtype))


def _numpy_dtype(etype: ir.Type) -> type:
    if isinstance(etype, ir.IntegerType):
        return np.bool_ if etype.width == 1 else np.int64 if etype.width == 64 else np.int32
    return np.float32
