"""`zero_empty_rows` (keras' re-masked softmax, as keras-hub's Gemma writes it) on every kernel target: a row
that sees no key is 0, the other rows are the kernel's own, against `attention_reference`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hlofuse.kernels import CompositeCall, Unsupported, kernel_for

B, T, S, N, K, H = 2, 12, 20, 4, 2, 16
ATTRS = {"causal": True, "decode": False, "layout": "BTNH", "mask_kind": "lengths", "masked_value": -1e9,
         "num_heads": N, "num_kv_heads": K, "q_offset": -4, "scale": 0.25, "softcap": 0.0, "window_left": -1,
         "window_right": 0, "zero_empty_rows": True}


def _inputs(dtype: jnp.dtype) -> tuple[jax.Array, ...]:
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal(shape, np.float32), dtype)
               for shape in ((B, T, N, H), (B, S, K, H), (B, S, K, H)))
    return q, k, v


def _call(dtype: str, operands: list[str], **overrides: object) -> CompositeCall:
    types = [((B, T, N, H), dtype), ((B, S, K, H), dtype), ((B, S, K, H), dtype)]
    types += [((B, T, S), "i1")] * ("mask" in operands) + [((B,), "i32")] * ("kv_lengths" in operands)
    return CompositeCall("hlofuse.attention", 1, {**ATTRS, "operands": operands, **overrides}, tuple(types))


TARGETS = ["reference", "cpu", "tpu-interpret", "gpu-interpret", "neuron-sim"]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("extra", ["kv_lengths", "mask"])
def test_rows_that_see_no_key_are_zeroed(target: str, extra: str) -> None:
    # q_offset -4 with causal: the first 4 query rows see no key; kv_lengths 0 (second batch row) or a mask
    # with an empty row hides every key of some rows too.
    from hlofuse.kernels.reference import attention_reference

    q, k, v = _inputs(jnp.float32)
    if extra == "kv_lengths":
        operand = jnp.asarray([S, 0], jnp.int32)
        masks = {"kv_lengths": operand}
    else:
        mask = np.random.default_rng(1).random((B, T, S)) < 0.5
        mask[0, 7] = False
        operand = jnp.asarray(mask)
        masks = {"mask": operand[:, None]}
    call = _call("f32", ["q", "k", "v", extra])
    if extra == "mask":  # the composite's mask operand is (B|1, N|1, T|1, S|1)
        call = CompositeCall(call.name, call.version, call.attributes,
                             (*call.operand_types[:3], ((B, 1, T, S), "i1")))
        operand = operand[:, None]
    try:
        fn = kernel_for(call, target)
    except Unsupported as reason:
        pytest.fail(f"{target} keeps the composite: {reason}")
    got = np.asarray(jax.jit(fn)(q, k, v, operand))
    want = np.asarray(attention_reference(q, k, v, scale=0.25, causal=True, q_offset=-4, masked_value=-1e9,
                                          zero_empty_rows=True, **masks))
    empty = np.all(want == 0, axis=-1)
    assert empty[:, :4].all() and empty.sum() > B * 4, "the case must have rows that see no key"
    np.testing.assert_array_equal(got[empty], 0)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("target", TARGETS[1:])
def test_a_fill_that_weighs_masked_keys_is_refused(target: str) -> None:
    """With a fill above -1e4 the masked keys of a row that sees some weigh more than 0, so zeroing empty rows
    afterwards would not be the program: every target keeps the composite, saying why."""
    with pytest.raises(Unsupported, match="-10000|-1e\\+04|masked"):
        kernel_for(_call("f32", ["q", "k", "v", "kv_lengths"], masked_value=-30.0), target)


@pytest.mark.parametrize("target", ["tpu", "gpu", "gpu-mosaic"])
def test_device_targets_lower_it(target: str) -> None:
    """The device targets emit their kernel for it too (lowered for their platform on this host)."""
    import hlofuse
    from hlofuse.pipeline import run_pipeline
    from hlofuse.testing.modules import clone_module, count_composites

    spec = jax.ShapeDtypeStruct((1, 64, 2, 64), jnp.bfloat16)
    lengths = jax.ShapeDtypeStruct((1,), jnp.int32)

    def f(q: jax.Array, k: jax.Array, v: jax.Array, kv_lengths: jax.Array) -> jax.Array:
        return hlofuse.attention(q, k, v, causal=True, kv_lengths=kv_lengths, masked_value=-1e9, zero_empty_rows=True)

    module = clone_module(jax.jit(f).lower(spec, spec, spec, lengths).compiler_ir("stablehlo"))
    result = run_pipeline(module, f"builtin.module(hlofuse-lower-kernels{{target={target}}})")
    assert count_composites(module) == 0, [str(r) for r in result.remarks]
    assert result.counters[f"attention_to_{target}"] == 1
