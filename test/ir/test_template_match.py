"""hlofuse.ir.template_match: a template's sentinel constants bind the program's parameters, by type."""

from __future__ import annotations

import jax
import jax.numpy as jnp
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
