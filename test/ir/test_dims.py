"""hlofuse.ir.dims: labels through reshapes, with atoms refined where a reshape cuts one."""

from __future__ import annotations

import pytest

from hlofuse.ir import layout
from hlofuse.ir.dims import DimsError, Factors, Refine, split_needed


def test_split_needed_names_the_atom_a_reshape_cuts():
    sizes = {"a": 8, "t": 4}
    # (8, 4) -> (2, 4, 4): the first target dim ends inside `a`, which must become (2, 4).
    assert split_needed((("a",), ("t",)), (2, 4, 4), sizes) == ("a", (2, 4))
    # Whole atoms regroup: nothing to cut.
    assert split_needed((("a",), ("t",)), (32,), sizes) is None
    # 8 cannot be cut into 3 x something.
    assert split_needed((("a",), ("t",)), (3, 8), {"a": 8, "t": 3}) is None


def test_regroup_raises_refine_then_succeeds_once_refined():
    factors = Factors()
    a, t = factors.fresh(8), factors.fresh(4)
    labels = ((a,), (t,))
    with pytest.raises(Refine) as cut:
        factors.regroup(labels, (2, 4, 4))
    factors.refine(cut.value.atom, cut.value.pieces)
    refined = tuple(tuple(x for atom in label for x in factors.leaves(atom)) for label in labels)
    assert factors.regroup(refined, (2, 4, 4)) == ((f"{a}.0",), (f"{a}.1",), (t,))
    assert factors.regroup(refined, (8, 4)) == ((f"{a}.0", f"{a}.1"), (t,))


def test_regroup_that_no_cut_explains_is_an_error():
    factors = Factors()
    a = factors.fresh(6)
    with pytest.raises(DimsError):
        factors.regroup(((a,),), (4,))


def test_fixpoint_reruns_with_the_refinements_and_names_atoms_the_same_way():
    factors = Factors()
    runs = []

    def analysis():
        folded = factors.label(8, "b")  # a folded batch x heads dim, as a bmm writes it
        runs.append(folded)
        return factors.regroup((folded,), (2, 4))

    result = factors.fixpoint(analysis)
    assert len(runs) == 2 and runs[1] == ("b0.0", "b0.1")
    assert result == (("b0.0",), ("b0.1",))
    assert layout.label_size(result[0], factors.sizes) == 2
