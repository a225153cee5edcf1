"""hlofuse.testing.modules: parse, run, count composites, regenerate inputs, compare outputs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jaxlib.mlir import ir

from hlofuse.testing import (
    assert_outputs_close,
    clone_module,
    count_composites,
    main_func,
    make_inputs,
    parse_module_text,
    run_module,
)

# One head of attention over (1, 4, 8) q/k/v, raised by hand into the composite; the decomposition is the
# plain subgraph, which XLA inlines when it compiles the module.
COMPOSITE_MODULE = """
module @hand_written_composite {
  func.func public @main(%q: tensor<1x4x8xf32>, %k: tensor<1x4x8xf32>,
                         %v: tensor<1x4x8xf32>) -> tensor<1x4x8xf32> {
    %0 = stablehlo.composite "hlofuse.attention" %q, %k, %v {
      composite_attributes = {scale = 0.353553385 : f32, causal = false},
      decomposition = @hlofuse.attention.impl, version = 1 : i32
    } : (tensor<1x4x8xf32>, tensor<1x4x8xf32>, tensor<1x4x8xf32>) -> tensor<1x4x8xf32>
    return %0 : tensor<1x4x8xf32>
  }
  func.func private @hlofuse.attention.impl(%q: tensor<1x4x8xf32>, %k: tensor<1x4x8xf32>,
                                            %v: tensor<1x4x8xf32>) -> tensor<1x4x8xf32> {
    %s = stablehlo.dot_general %q, %k, batching_dims = [0] x [0], contracting_dims = [2] x [2]
        : (tensor<1x4x8xf32>, tensor<1x4x8xf32>) -> tensor<1x4x4xf32>
    %c = stablehlo.constant dense<0.353553385> : tensor<1x4x4xf32>
    %ss = stablehlo.multiply %s, %c : tensor<1x4x4xf32>
    %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %m = stablehlo.reduce(%ss init: %ninf) applies stablehlo.maximum across dimensions = [2]
        : (tensor<1x4x4xf32>, tensor<f32>) -> tensor<1x4xf32>
    %mb = stablehlo.broadcast_in_dim %m, dims = [0, 1] : (tensor<1x4xf32>) -> tensor<1x4x4xf32>
    %d = stablehlo.subtract %ss, %mb : tensor<1x4x4xf32>
    %e = stablehlo.exponential %d : tensor<1x4x4xf32>
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %l = stablehlo.reduce(%e init: %zero) applies stablehlo.add across dimensions = [2]
        : (tensor<1x4x4xf32>, tensor<f32>) -> tensor<1x4xf32>
    %lb = stablehlo.broadcast_in_dim %l, dims = [0, 1] : (tensor<1x4xf32>) -> tensor<1x4x4xf32>
    %p = stablehlo.divide %e, %lb : tensor<1x4x4xf32>
    %o = stablehlo.dot_general %p, %v, batching_dims = [0] x [0], contracting_dims = [2] x [1]
        : (tensor<1x4x4xf32>, tensor<1x4x8xf32>) -> tensor<1x4x8xf32>
    return %o : tensor<1x4x8xf32>
  }
}
"""

# The same composite twice inside a while body (two "layers"), plus an unrelated composite: counting must
# reach nested regions and filter on the name.
NESTED_MODULE = """
module @nested_composites {
  func.func public @main(%x: tensor<1x4x8xf32>) -> tensor<1x4x8xf32> {
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    %w:2 = stablehlo.while(%i = %c0, %h = %x) : tensor<i32>, tensor<1x4x8xf32>
    cond {
      %two = stablehlo.constant dense<2> : tensor<i32>
      %lt = stablehlo.compare LT, %i, %two : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %lt : tensor<i1>
    } do {
      %a = stablehlo.composite "hlofuse.attention" %h, %h, %h {decomposition = @attn, version = 1 : i32}
          : (tensor<1x4x8xf32>, tensor<1x4x8xf32>, tensor<1x4x8xf32>) -> tensor<1x4x8xf32>
      %b = stablehlo.composite "hlofuse.attention" %a, %a, %a {decomposition = @attn, version = 1 : i32}
          : (tensor<1x4x8xf32>, tensor<1x4x8xf32>, tensor<1x4x8xf32>) -> tensor<1x4x8xf32>
      %one = stablehlo.constant dense<1> : tensor<i32>
      %n = stablehlo.add %i, %one : tensor<i32>
      stablehlo.return %n, %b : tensor<i32>, tensor<1x4x8xf32>
    }
    %t = stablehlo.composite "other.tanh" %w#1 {decomposition = @tanh_impl}
        : (tensor<1x4x8xf32>) -> tensor<1x4x8xf32>
    return %t : tensor<1x4x8xf32>
  }
  func.func private @attn(%q: tensor<1x4x8xf32>, %k: tensor<1x4x8xf32>,
                          %v: tensor<1x4x8xf32>) -> tensor<1x4x8xf32> {
    %0 = stablehlo.add %q, %v : tensor<1x4x8xf32>
    return %0 : tensor<1x4x8xf32>
  }
  func.func private @tanh_impl(%x: tensor<1x4x8xf32>) -> tensor<1x4x8xf32> {
    %0 = stablehlo.tanh %x : tensor<1x4x8xf32>
    return %0 : tensor<1x4x8xf32>
  }
}
"""


def attention_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    s = np.einsum("bqd,bkd->bqk", q.astype(np.float64), k.astype(np.float64)) * scale
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bqk,bkd->bqd", p, v.astype(np.float64))


def test_composite_module_counts_and_runs():
    module = parse_module_text(COMPOSITE_MODULE)
    assert count_composites(module) == 1
    assert count_composites(module, "hlofuse.sample") == 0
    assert count_composites(module, None) == 1
    q, k, v = make_inputs([{"shape": [1, 4, 8], "dtype": "float32", "init": {"kind": "normal"}}] * 3, seed=3)
    (out,) = run_module(module, [q, k, v])
    assert out.shape == (1, 4, 8) and out.dtype == np.float32
    np.testing.assert_allclose(out, attention_reference(q, k, v, 8**-0.5), rtol=1e-5, atol=1e-6)


def test_count_composites_walks_nested_regions():
    module = parse_module_text(NESTED_MODULE)
    assert count_composites(module) == 2
    assert count_composites(module, "other.tanh") == 1
    assert count_composites(module, None) == 3
    assert count_composites(main_func(module).operation) == 2
    x = make_inputs([{"shape": [1, 4, 8], "dtype": "float32", "init": {"kind": "uniform"}}], seed=0)
    # Each iteration maps h -> (h + h) + (h + h) = 4h; two iterations, then tanh.
    np.testing.assert_allclose(run_module(NESTED_MODULE, x)[0], np.tanh(16 * x[0]), rtol=1e-6)


def test_run_module_matches_jax_on_lowered_text():
    def f(x, y):
        return jnp.tanh(x) @ y, x.sum(), (x > 0).astype(jnp.int32)

    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    y = np.arange(8, dtype=np.float32).reshape(4, 2)
    text = jax.jit(f).lower(x, y).compiler_ir("stablehlo").operation.get_asm(enable_debug_info=False)
    outs = run_module(text, [x, y])
    assert_outputs_close([np.asarray(r) for r in jax.jit(f)(x, y)], outs)
    assert [o.dtype for o in outs] == [np.float32, np.float32, np.int32]


def test_run_module_bfloat16_and_bool():
    def f(x, m):
        return jnp.where(m, x * 2, x).astype(jnp.bfloat16)

    x = make_inputs([{"shape": [8], "dtype": "bfloat16", "init": {"kind": "normal"}}], seed=1)[0]
    m = np.arange(8) % 2 == 0
    text = jax.jit(f).lower(x, m).compiler_ir("stablehlo").operation.get_asm()
    (out,) = run_module(text, [x, m])
    assert out.dtype == ml_dtypes.bfloat16
    assert_outputs_close([np.asarray(f(x, m))], [out])


def test_run_module_custom_call_to_registered_ffi_target():
    # jaxlib's CPU LAPACK kernels are FFI targets registered at start-up.
    a = np.array([[4.0, 2.0], [2.0, 3.0]], np.float32)
    text = jax.jit(jnp.linalg.cholesky).lower(a).compiler_ir("stablehlo").operation.get_asm()
    assert "stablehlo.custom_call" in text
    (out,) = run_module(text, [a])
    np.testing.assert_allclose(out, np.linalg.cholesky(a), rtol=1e-6)


def test_run_module_rejects_wrong_arguments():
    module = parse_module_text(COMPOSITE_MODULE)
    x = np.zeros((1, 4, 8), np.float32)
    with pytest.raises(ValueError, match="takes 3 arguments"):
        run_module(module, [x, x])
    with pytest.raises(ValueError, match="argument 2"):
        run_module(module, [x, x, x.astype(np.float64)])


def test_clone_module_is_independent():
    module = parse_module_text(COMPOSITE_MODULE)
    copy = clone_module(module)
    for op in list(main_func(copy).regions[0].blocks[0].operations):
        if op.operation.name == "stablehlo.composite":
            op.operation.attributes["name"] = ir.StringAttr.get("renamed", context=copy.context)
    assert count_composites(copy) == 0
    assert count_composites(module) == 1


def test_make_inputs_recipes_are_deterministic():
    entry = {
        "seed": 7,
        "inputs": [
            {
                "name": "w",
                "shape": [64, 32],
                "dtype": "float32",
                "init": {"kind": "normal", "mean": 1.0, "std": 0.1},
            },
            {
                "name": "ids",
                "shape": [2, 16],
                "dtype": "int32",
                "init": {"kind": "randint", "low": 0, "high": 10},
            },
            {"name": "mask", "shape": [100], "dtype": "bool", "init": {"kind": "bernoulli", "p": 0.8}},
            {"name": "h", "shape": [4], "dtype": "bfloat16", "init": {"kind": "fill", "value": 0.5}},
            {"name": "pad", "shape": [2, 16], "dtype": "int32", "init": {"kind": "ones"}},
            {
                "name": "u",
                "shape": [3],
                "dtype": "float16",
                "init": {"kind": "uniform", "low": -1, "high": 1},
            },
        ],
    }
    w, ids, mask, h, pad, u = make_inputs(entry)
    assert w.dtype == np.float32 and w.shape == (64, 32)
    assert abs(w.mean() - 1.0) < 0.02 and abs(w.std() - 0.1) < 0.02
    assert ids.dtype == np.int32 and ids.min() >= 0 and ids.max() < 10
    assert mask.dtype == bool and 0.6 < mask.mean() < 0.95
    assert h.dtype == ml_dtypes.bfloat16 and np.all(h.astype(np.float32) == 0.5)
    assert np.all(pad == 1) and u.dtype == np.float16 and np.all(np.abs(u) <= 1)
    again = make_inputs(entry, 7)
    for a, b in zip((w, ids, mask, h, pad, u), again, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(make_inputs(entry, 8)[0], w)
    with pytest.raises(ValueError, match="unknown input recipe"):
        make_inputs([{"shape": [1], "dtype": "float32", "init": {"kind": "zipf"}}], 0)


def test_assert_outputs_close_tolerances():
    x = np.linspace(1, 2, 10, dtype=np.float32)
    assert_outputs_close([x], [x * np.float32(1 + 5e-6)])
    with pytest.raises(AssertionError):
        assert_outputs_close([x], [x * np.float32(1 + 1e-4)])
    # Near zero, the small atol absorbs last-bit differences.
    assert_outputs_close([np.zeros(3, np.float32)], [np.full(3, 5e-7, np.float32)])
    # bf16 is loose: one ulp at 1.0 (2**-7) passes, ten do not.
    one = np.ones(4, ml_dtypes.bfloat16)
    assert_outputs_close([one], [(one.astype(np.float32) + 2**-7).astype(ml_dtypes.bfloat16)])
    with pytest.raises(AssertionError):
        assert_outputs_close([one], [(one.astype(np.float32) + 10 * 2**-7).astype(ml_dtypes.bfloat16)])
    # Explicit overrides win.
    assert_outputs_close([x], [x * np.float32(1 + 1e-4)], rtol=1e-3)


def test_assert_outputs_close_nan_inf_int_and_shapes():
    a = np.array([1.0, np.nan, np.inf, -np.inf], np.float32)
    assert_outputs_close([a], [a.copy()])
    with pytest.raises(AssertionError, match="NaN positions"):
        assert_outputs_close([a], [np.array([np.nan, 1.0, np.inf, -np.inf], np.float32)])
    with pytest.raises(AssertionError):
        assert_outputs_close([a], [np.array([1.0, np.nan, -np.inf, -np.inf], np.float32)])
    with pytest.raises(AssertionError):
        assert_outputs_close([np.arange(3, dtype=np.int32)], [np.array([0, 1, 3], np.int32)])
    with pytest.raises(AssertionError, match="expected"):
        assert_outputs_close([np.zeros(3, np.float32)], [np.zeros(4, np.float32)])
    with pytest.raises(AssertionError, match="expected"):
        assert_outputs_close([np.zeros(3, np.float32)], [np.zeros(3, np.float64)])
    with pytest.raises(AssertionError, match="output count"):
        assert_outputs_close([a], [a, a])
