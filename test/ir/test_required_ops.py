"""hlofuse.ir.required_ops: the ops a function's jaxpr says every lowering holds, and none that a simplification
could take away (an op on constants, a dead one, an identity at these shapes, a cond's branch). Each case lowers the
function and prepares it as the sampling pass does, and checks the implied ops against the ops it holds."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest

from hlofuse.ir.required_ops import required_ops
from hlofuse.pipeline import run_pipeline
from hlofuse.testing import clone_module

_OP_NAME = re.compile(r'(?:^|= )"?((?:stablehlo|chlo)\.\w+)', re.MULTILINE)


def _both(fn, shape=(2, 16)) -> tuple[frozenset[str], frozenset[str]]:  # noqa: ANN001
    """What the jaxpr implies, and the ops of the function lowered for the CPU and prepared."""
    args = (jax.ShapeDtypeStruct(shape, jnp.float32), jax.ShapeDtypeStruct((2,), jnp.uint32))
    traced = jax.jit(fn).trace(*args)
    module = clone_module(traced.lower(lowering_platforms=("cpu",)).compiler_ir("stablehlo"))
    run_pipeline(module, "builtin.module(hlofuse-prepare)")
    return required_ops(traced.jaxpr.jaxpr), frozenset(_OP_NAME.findall(str(module)))


def _nucleus(x, key):  # noqa: ANN001, ANN202
    """A sorted nucleus scattered back to vocabulary order (Hugging Face's TopP) and drawn."""
    order = jnp.argsort(x, axis=-1)
    ranked = jnp.take_along_axis(x, order, axis=-1)
    keep = jnp.cumsum(jax.nn.softmax(ranked, axis=-1), axis=-1) > 0.1
    rows = jnp.arange(x.shape[0])[:, None]
    masked = jnp.full_like(x, -jnp.inf).at[rows, order].set(jnp.where(keep, ranked, -jnp.inf))
    return jax.random.categorical(key, masked)


IMPLIED = {
    "a sort of the logits": (_nucleus, {"stablehlo.sort"}),
    "a scatter at the argmax": (lambda x, key: jnp.zeros_like(x).at[jnp.arange(x.shape[0]), jnp.argmax(x, axis=-1)]
                                .set(1.0) + x, {"stablehlo.scatter"}),
    "a transpose of the logits": (lambda x, key: jnp.argmax(x.T, axis=0), {"stablehlo.transpose"}),
    "a reverse": (lambda x, key: jnp.concatenate([x[:, ::-1], x], axis=-1).sum(-1), {"stablehlo.reverse"}),
    "a scan over the rows": (lambda x, key: jax.lax.scan(lambda c, r: (c + r.max(), r.argmax()), 0.0, x)[1],
                             {"stablehlo.while"}),
    "a sort inside a nested jit": (lambda x, key: jax.jit(lambda v: jnp.sort(v, axis=-1))(x)[:, -1],
                                   {"stablehlo.sort"}),
}


@pytest.mark.parametrize("case", sorted(IMPLIED))
def test_an_op_the_jaxpr_implies_is_in_the_lowering(case: str) -> None:
    fn, want = IMPLIED[case]
    implied, held = _both(fn)
    assert want <= implied <= held


NOT_IMPLIED = {
    # sorted constants: folded
    "a sort of constants": lambda x, key: x + jnp.sort(jnp.arange(16.0)[::-1]),
    # computed, never used
    "a dead sort": lambda x, key: (jnp.sort(x, axis=-1), x.sum(-1))[1],
    # a transpose that moves only a unit dim: a reshape
    "a transpose of a unit dim": lambda x, key: jnp.transpose(x[:, None, :], (1, 0, 2)).sum(),
    # a concatenate of one non-empty operand
    "a concatenate with an empty operand": lambda x, key: jnp.concatenate([x, x[:, :0]], axis=-1).max(-1),
    # a gather at constant indices: may become a slice
    "a gather at constant indices": lambda x, key: jnp.take(x, jnp.array([3, 1]), axis=-1).sum(-1),
    # a branch hlofuse-prepare may inline away
    "a sort in one branch of a cond": lambda x, key: jax.lax.cond(key[0] > 0, lambda v: jnp.sort(v, axis=-1),
                                                                  lambda v: v, x),
    # a scan unrolled whole
    "a scan unrolled whole": lambda x, key: jax.lax.scan(lambda c, r: (c + r.max(), r.argmax()), 0.0, x,
                                                         unroll=True)[1],
    # a second result of a nested jit that nothing reads
    "a dead result of a nested jit": lambda x, key: jax.jit(lambda v: (jnp.sort(v, axis=-1), v * 2))(x)[1],
}


# hlofuse-prepare's normal forms take these ops away: a take along an argsort (the sort's values), one along the
# argsort of an argsort (a sort_key_val), a shift written as a concatenate (a pad), a roll's rolled-in place set (a
# pad), a scatter of the rows to an argsort's places (a sort_key_val), a column of a reversed row (the row's column
# at the mirrored place)
NORMALISED_AWAY = {
    "a take along an argsort": (lambda x, key: jnp.take_along_axis(x, jnp.argsort(x, axis=-1), axis=-1)[:, 0],
                                "stablehlo.gather"),
    "a take along an inverse": (lambda x, key: jnp.take_along_axis(
        x, jnp.argsort(jnp.argsort(x, axis=-1), axis=-1), axis=-1), "stablehlo.gather"),
    "a shift by a concatenate": (lambda x, key: jnp.concatenate([jnp.zeros_like(x[:, :1]), x[:, :-1]], axis=-1),
                                 "stablehlo.concatenate"),
    "a roll's first place set": (lambda x, key: jnp.roll(x, 1, axis=-1).at[:, 0].set(0.0), "stablehlo.scatter"),
    "a put-back by a scatter": (_nucleus, "stablehlo.scatter"),
    "a column of a reversed sort": (lambda x, key: jnp.sort(x, axis=-1)[:, ::-1][:, jnp.asarray(3, jnp.int32)],
                                    "stablehlo.reverse"),
}


@pytest.mark.parametrize("case", sorted(NORMALISED_AWAY))
def test_an_op_a_normal_form_takes_away_is_not_implied(case: str) -> None:
    fn, op = NORMALISED_AWAY[case]
    implied, held = _both(fn)
    assert op not in held
    assert implied <= held


@pytest.mark.parametrize("case", sorted(NOT_IMPLIED))
def test_an_op_a_simplification_may_remove_is_not_implied(case: str) -> None:
    implied, held = _both(NOT_IMPLIED[case])
    assert implied <= held
    assert "stablehlo.sort" not in implied and "stablehlo.transpose" not in implied
    assert "stablehlo.concatenate" not in implied and "stablehlo.gather" not in implied
    assert "stablehlo.while" not in implied
