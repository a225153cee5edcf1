"""hlofuse.ir.template_match: a template's sentinel constants bind the program's parameters, by type."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxlib.mlir import ir

from hlofuse.ir.template_match import match_template
from hlofuse.testing import clone_module
from hlofuse.testing.modules import main_func

SENTINELS = {"k": 1234567, "p": 0.87654321}


def _lowered(fn, context: ir.Context | None = None):
    """The module of `fn` on (2, 16) f32 rows, parsed into `context`; its root and arguments."""
    module = clone_module(jax.jit(fn).lower(jax.ShapeDtypeStruct((2, 16), jnp.float32)).compiler_ir("stablehlo"))
    if context is not None:
        module = ir.Module.parse(str(module), context=context)
    block = main_func(module).regions[0].blocks[0]
    return module, list(block.operations)[-1].operands[0], list(block.arguments)


def _counted(k, p):
    """A searched top-k's test and a top-p's: a count of values compared with an integer k, a mass with a float p."""
    return lambda x: (jnp.sum(x > 0.5, axis=-1) >= k) & (jnp.sum(jnp.where(x > 0.5, x, 0.0), axis=-1) < p)


def test_an_integer_sentinel_binds_the_programs_integer_constant():
    program, root, _ = _lowered(_counted(40, 0.9))
    _, template_root, args = _lowered(_counted(SENTINELS["k"], SENTINELS["p"]), program.context)
    found = match_template(root, template_root, args, SENTINELS)
    assert found is not None
    assert found.params["k"] == 40 and isinstance(found.params["k"], int)
    assert abs(found.params["p"] - 0.9) < 1e-7


def test_a_float_sentinel_binds_no_integer_constant():
    """The float sentinel p rounds to 0 as an integer: it must not bind the program's integer 0."""
    program, root, _ = _lowered(lambda x: jnp.sum(x > 0.5, axis=-1) >= 0)
    _, template_root, args = _lowered(lambda x: jnp.sum(x > 0.5, axis=-1) >= 1, program.context)
    assert match_template(root, template_root, args, {"p": 0.87654321}) is None


def test_an_integer_template_constant_that_is_no_sentinel_must_be_equal():
    program, root, _ = _lowered(_counted(40, 0.9))
    _, template_root, args = _lowered(_counted(41, SENTINELS["p"]), program.context)
    assert match_template(root, template_root, args, {"p": SENTINELS["p"]}) is None


# --- a compare one step of strictness away binds the constant moved by one step --------------------------------------

STRICTNESS = {">": (lambda a, b: a > b), ">=": (lambda a, b: a >= b), "<": (lambda a, b: a < b),
              "<=": (lambda a, b: a <= b)}
ONE_STEP = [(">", ">="), (">=", ">"), ("<", "<="), ("<=", "<")]


@pytest.mark.parametrize(("template_op", "program_op"), ONE_STEP)
@pytest.mark.parametrize("constant_first", [False, True])
def test_a_compare_a_step_of_strictness_away_binds_the_adjacent_float(template_op: str, program_op: str,
                                                                      constant_first: bool) -> None:
    def compare(op: str, q: float):  # noqa: ANN202
        def fn(x):  # noqa: ANN001, ANN202
            c = jnp.cumsum(x, axis=-1)
            return STRICTNESS[op](q, c) if constant_first else STRICTNESS[op](c, q)
        return fn

    program, root, _ = _lowered(compare(program_op, 0.9))
    _, template_root, args = _lowered(compare(template_op, SENTINELS["p"]), program.context)
    found = match_template(root, template_root, args, SENTINELS)
    assert found is not None
    p = np.float32(found.params["p"])
    assert p != np.float32(0.9) and abs(float(p) - 0.9) < 1e-6
    # the template's compare at the bound p computes the program's everywhere, the values around both constants too
    near = np.array([np.nextafter(np.float32(0.9), np.float32(d)) for d in (-1, 1)] + [0.9, p, -1, 2, np.nan],
                    np.float32)
    program_fn, template_fn = compare(program_op, 0.9), compare(template_op, float(p))
    values = np.diff(near, prepend=np.float32(0))[None, :].astype(np.float32)  # cumsum gives back `near`, nearly
    np.testing.assert_array_equal(np.asarray(jax.jit(program_fn)(values)), np.asarray(jax.jit(template_fn)(values)))
    direct = {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal}
    for c in near:
        a, b = (float(p), c) if constant_first else (c, float(p))
        a0, b0 = (np.float32(0.9), c) if constant_first else (c, np.float32(0.9))
        assert direct[template_op](np.float32(a), np.float32(b)) == direct[program_op](a0, b0), c


def test_an_integer_compare_a_step_away_binds_nothing() -> None:
    """`count >= 1` is `count > 0`, but k = 0 is no top-k to a form (the differential generator found a searched top-k
    at k = 1 so bound, drawing other ids): integers are not moved."""
    program, root, _ = _lowered(lambda x: jnp.sum(x > 0.5, axis=-1) >= 1)
    _, template_root, args = _lowered(lambda x: jnp.sum(x > 0.5, axis=-1) > SENTINELS["k"], program.context)
    assert match_template(root, template_root, args, SENTINELS) is None


@pytest.mark.parametrize(("template", "program"), [
    (lambda x: jnp.cumsum(x, axis=-1) > SENTINELS["p"], lambda x: jnp.cumsum(x, axis=-1) < 0.9),  # another way
    (lambda x: jnp.cumsum(x, axis=-1) > SENTINELS["p"], lambda x: jnp.cumsum(x, axis=-1) == 0.9),
    (lambda x: jnp.cumsum(x, axis=-1) > 0.5, lambda x: jnp.cumsum(x, axis=-1) >= 0.5),  # no parameter to move
    (lambda x: jnp.cumsum(x, axis=-1) > SENTINELS["p"] * x, lambda x: jnp.cumsum(x, axis=-1) >= 0.9 * x),  # no constant
    (lambda x: jnp.cumsum(x, axis=-1) > SENTINELS["p"], lambda x: jnp.cumsum(x, axis=-1) >= 0.0),  # 0: -0 and +0
    (lambda x: jnp.cumsum(x, axis=-1) > SENTINELS["p"], lambda x: jnp.cumsum(x, axis=-1) >= jnp.inf),
    (lambda x: jnp.cumsum(x, axis=-1) > SENTINELS["p"], lambda x: jnp.cumsum(x, axis=-1) >= 1e-40),  # subnormal
    (lambda x: jnp.cumsum(x, axis=-1) >= SENTINELS["p"], lambda x: jnp.cumsum(x, axis=-1) > 1.0),  # p = 1: no filter
    (lambda x: jnp.cumsum(x, axis=-1) > SENTINELS["p"], lambda x: jnp.cumsum(x, axis=-1) >= 1.0),
], ids=["other_direction", "equal", "no_sentinel", "not_a_constant", "zero", "infinity", "subnormal", "above_one",
        "at_one"])
def test_no_other_compare_binds_a_moved_constant(template, program) -> None:  # noqa: ANN001
    program_module, root, _ = _lowered(program)
    _, template_root, args = _lowered(template, program_module.context)
    assert match_template(root, template_root, args, SENTINELS) is None


def test_a_constant_read_by_two_compares_a_step_away_binds_once() -> None:
    """One constant (its broadcast shared by CSE) read by two `>=` compares matches a template of two `>`: the second
    compare meets the constant already matched under the same step."""
    program, root, _ = _lowered(lambda x: (jnp.cumsum(x, axis=-1) >= 0.9) & (x >= 0.9))
    _, template_root, args = _lowered(lambda x: (jnp.cumsum(x, axis=-1) > SENTINELS["p"]) & (x > SENTINELS["p"]),
                                      program.context)
    found = match_template(root, template_root, args, SENTINELS)
    assert found is not None and np.float32(found.params["p"]) == np.nextafter(np.float32(0.9), np.float32(0))


@pytest.mark.parametrize("program", [
    lambda x: (jnp.cumsum(x, axis=-1) >= 0.9) & (x > 0.9),
    lambda x: (jnp.cumsum(x, axis=-1) > 0.9) & (x >= 0.9),
], ids=["stepped_first", "stepped_second"])
def test_a_constant_read_a_step_away_in_one_compare_only_binds_nothing(program) -> None:  # noqa: ANN001
    """The template's one p read by two `>` compares; the program's q read by `>=` in one, `>` in the other: no one
    p computes both, so no match (whichever compare meets the constant first)."""
    program_module, root, _ = _lowered(program)
    _, template_root, args = _lowered(lambda x: (jnp.cumsum(x, axis=-1) > SENTINELS["p"]) & (x > SENTINELS["p"]),
                                      program_module.context)
    assert match_template(root, template_root, args, SENTINELS) is None
