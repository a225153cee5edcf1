"""Dims analysis: the logical factors each dim of each value carries, through reshapes that merge or split.

A dim's label (hlofuse.ir.layout) is a tuple of atoms, major to minor. The analysis starts from fresh
atoms on the dims of one op (an attention site's q·k dot) and follows them forward and backward through
layout ops. Where a reshape cuts an atom (PyTorch's `bmm` folds batch and heads into one dim, and a
later reshape splits them again; `repeat_kv` splits heads into kv heads and groups), the atom is
*refined* into two factors everywhere and the analysis runs again from the start. So after a fixpoint
every reshape on the site merges or splits whole atoms, and each atom is one logical factor: a batch,
a head, a group, a query or key position, a head dim. `Factors` holds the refinements; a caller runs

    factors = Factors()
    result = factors.fixpoint(lambda: analysis(factors))

where `analysis` labels values with `factors.forward` / `factors.backward`, which raise `Refine`
when an atom must split (the fixpoint catches it, records the split and calls `analysis` again).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from jaxlib.mlir import ir

from hlofuse.ir import layout
from hlofuse.ir.layout import Label, Labels

R = TypeVar("R")
MAX_REFINEMENTS = 16
# Ops whose result carries its first operand's data in another arrangement.
LAYOUT_OPS = ("stablehlo.transpose", "stablehlo.reshape", "stablehlo.convert", "stablehlo.broadcast_in_dim")


class Refine(Exception):  # noqa: N818  (a control signal, not an error)
    """`atom` must be cut into factors of `pieces` (major to minor) before the analysis can go on."""

    def __init__(self, atom: str, pieces: tuple[int, ...]) -> None:
        super().__init__(f"refine {atom} into {pieces}")
        self.atom, self.pieces = atom, pieces


class DimsError(Exception):
    """The dims cannot be followed (a non-layout op, or a reshape that cannot be explained by factors)."""


def split_needed(labels: Labels, shape: Sequence[int], sizes: dict[str, int]) -> tuple[str, tuple[int, int]] | None:
    """Where `layout.regroup(labels, shape)` fails because a target dim ends inside an atom: that atom and
    the two factor sizes that would let it succeed; None if no single cut helps (or none is needed)."""
    atoms = [atom for label in labels for atom in label if sizes[atom] != 1]
    position = 0
    for n in shape:
        if n == 1:
            continue
        product = 1
        while product < n and position < len(atoms):
            size = sizes[atoms[position]]
            if product * size > n:
                want = n // product if n % product == 0 else 0
                if want > 1 and size % want == 0:
                    return atoms[position], (want, size // want)
                return None
            product *= size
            position += 1
        if product != n:
            return None
    return None


@dataclass
class Factors:
    """Atom sizes and the refinements found so far (atom -> its two factors)."""

    sizes: dict[str, int] = field(default_factory=dict)
    splits: dict[str, tuple[str, str]] = field(default_factory=dict)
    _count: int = 0

    def fresh(self, size: int, hint: str = "a") -> str:
        """A new atom of `size` (refined as earlier runs found it must be)."""
        name = f"{hint}{self._count}"
        self._count += 1
        self.sizes[name] = size
        return name

    def leaves(self, atom: str) -> tuple[str, ...]:
        """The atom's current factors, major to minor."""
        if atom not in self.splits:
            return (atom,)
        major, minor = self.splits[atom]
        return self.leaves(major) + self.leaves(minor)

    def label(self, size: int, hint: str = "a") -> Label:
        """A fresh dim label of `size`: one atom, expanded into its factors."""
        if size == 1:
            return ()
        return tuple(a for a in self.leaves(self.fresh(size, hint)) if self.sizes[a] != 1)

    def refine(self, atom: str, pieces: tuple[int, ...]) -> None:
        major, minor = f"{atom}.0", f"{atom}.1"
        self.sizes[major], self.sizes[minor] = pieces
        self.splits[atom] = (major, minor)

    def restart(self) -> None:
        """Fresh atoms are numbered again from 0, so a rerun names the same dims with the same atoms."""
        self._count = 0

    def fixpoint(self, analysis: Callable[[], R]) -> R:
        for _ in range(MAX_REFINEMENTS):
            self.restart()
            try:
                return analysis()
            except Refine as cut:
                self.refine(cut.atom, cut.pieces)
        raise DimsError(f"the dims need more than {MAX_REFINEMENTS} refinements")

    # ----- following labels through one op -------------------------------------------------------

    def regroup(self, labels: Labels, shape: Sequence[int]) -> Labels:
        """`labels` rearranged for `shape` (a reshape); raises Refine where an atom must be cut."""
        result = layout.regroup(labels, shape, self.sizes)
        if result is not None:
            return result
        cut = split_needed(labels, shape, self.sizes)
        if cut is None:
            raise DimsError(f"a reshape to {tuple(shape)} does not regroup the dims {labels}")
        raise Refine(*cut)

    def forward(self, op: ir.Operation, labels: Labels) -> Labels:
        """Labels of a layout op's result from its first operand's."""
        if op.name == "stablehlo.reshape":
            return self.regroup(labels, _shape(op.results[0]))
        result = layout.forward(op, labels, self.sizes)
        if result is None:
            raise DimsError(f"cannot follow dims through {op.name}")
        return result

    def backward(self, op: ir.Operation, labels: Labels) -> Labels:
        """Labels of a layout op's first operand from its result's (a broadcast dim gets `()`)."""
        if op.name == "stablehlo.reshape":
            return self.regroup(labels, _shape(op.operands[0]))
        result = layout.backward(op, labels, self.sizes)
        if result is None:
            raise DimsError(f"cannot follow dims back through {op.name}")
        return layout.normalize(result, self.sizes)

    def forward_all(self, labels: Labels, ops: Sequence[ir.Operation]) -> Labels:
        for op in ops:
            labels = self.forward(op, labels)
        return labels

    def atoms_of(self, labels: Labels) -> list[str]:
        return [atom for label in labels for atom in label]


def _shape(value: ir.Value) -> tuple[int, ...]:
    shape = layout.static_shape(value)
    if shape is None:
        raise DimsError("dynamic shapes are not supported")
    return shape


__all__ = ["LAYOUT_OPS", "DimsError", "Factors", "Refine", "split_needed"]
