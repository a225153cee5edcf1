"""Differential test: hypothesis writes random attention programs; each must fuse, and match the original.

Every generated program (attention_programs.AttentionSpec, drawn by `attention_specs`) is lowered with
jax.jit, run through the default pipeline, and must hold exactly one `hlofuse.attention` composite whose
attributes say what the spec says. Then four things are compared on the same inputs: the original module,
the fused one (XLA inlines the decomposition), the fused one with every composite lowered to the jnp
reference (`hlofuse-lower-kernels{target=reference}`, which reads nothing but the composite's operands
and attributes), and a float64 numpy oracle of the spec (attention_programs.expected_output).

Tolerances. float32: the contract's rtol 1e-5 (atol 1e-6; S * u * max|v| against the reference, which
sums in another order) between original, fused and reference; the
original must also match the float64 oracle to 1e-4, which checks the generator wrote what the spec says.
bfloat16 / float16: the original rounds logits and probabilities in the low dtype, the reference keeps
them in float32, so they legitimately differ by the original's own rounding error. That error is measured
against the oracle, and the fused and reference outputs may be off the oracle by at most twice as much,
plus two units of roundoff (2**-8 for bfloat16, 2**-11 for float16) of the output's magnitude for the
final rounding: fusion may change rounding but must not lose accuracy. Original and fused (the same ops)
must also agree within the harness's per-dtype tolerances (hlofuse.testing.modules.TOLERANCES).

Profiles: HYPOTHESIS_PROFILE=ci (default, a few dozen programs, part of test.sh) or =thorough
(hundreds). Examples are derandomized, so CI always runs the same programs.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable

import hypothesis.strategies as st
import jax
import numpy as np
import pytest
from attention_programs import (
    BIAS_SHAPES,
    COMBINES,
    FILLS,
    LAYOUTS,
    MASK_SHAPES,
    MASK_STYLES,
    SCALES,
    UPCASTS,
    AttentionSpec,
    allows_empty_rows,
    build,
    expected_output,
    fill_value,
    inputs,
    structural_visibility,
    total_scale,
)
from hypothesis import HealthCheck, settings
from hypothesis import given as hypothesis_given

from hlofuse.composites import AttentionAttrs
from hlofuse.kernels.reference import attention_visibility
from hlofuse.pipeline import run_pipeline
from hlofuse.testing.modules import (
    assert_outputs_close,
    attention_attrs,
    clone_module,
    count_composites,
    run_module,
)

_COMMON = {"deadline": None, "derandomize": True, "suppress_health_check": [HealthCheck.too_slow],
           "print_blob": True}
settings.register_profile("ci", max_examples=36, **_COMMON)
settings.register_profile("thorough", max_examples=400, **_COMMON)
PROFILE = settings.get_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Unit roundoff of each dtype: half the distance from 1 to the next value.
ROUNDOFF = {"float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}
REFERENCE = "builtin.module(hlofuse-lower-kernels{target=reference})"


# ----- the strategy ------------------------------------------------------------------------------------


@st.composite
def attention_specs(draw: st.DrawFn, dtype: str, same_head_dims: bool = False) -> AttentionSpec:
    """Any attention program hlofuse claims to fuse (docs/composites.md), over small sizes, less the
    families of KNOWN_GAPS (each excluded below where it is drawn)."""
    # jax.nn.dot_product_attention asks for F16_F16_F32 dots, which XLA:CPU cannot compile: no nn in float16.
    api = draw(st.sampled_from(["jnp", "jnp", "jnp", "nn"])) if dtype != "float16" else "jnp"
    nn = api == "nn"
    b = draw(st.integers(1, 2))
    n = draw(st.sampled_from([1, 2, 4]))
    kv = draw(st.sampled_from([k for k in (1, 2, 4) if n % k == 0]))
    h = draw(st.sampled_from([8, 16, 32]))
    d = h if nn or same_head_dims else draw(st.sampled_from([8, 16, 32]))
    t = draw(st.integers(1, 32))
    s = draw(st.integers(2, 32))  # not 1: gap "single_key"
    gqa = "none" if nn or kv == n else draw(st.sampled_from(
        ["repeat", "grouped", "expand"] + (["squeezed"] if kv == 1 else [])))
    layouts = {"grouped": ("btnh", "v_left"), "squeezed": ("btnh",)}.get(gqa, LAYOUTS)
    causal = draw(st.booleans())
    window = st.one_of(st.none(), st.integers(0, 8))
    window_left, window_right = draw(window), draw(window) if nn or not causal else None
    spec = AttentionSpec(
        b=b, t=t, s=s, n=n, kv=kv, h=h, d=d, dtype=dtype,
        upcast="none" if dtype == "float32" or nn else draw(st.sampled_from(UPCASTS)),
        api=api,
        scale=draw(st.sampled_from(("divide_sqrt", "multiply") if nn else SCALES)),
        scale_value=draw(st.sampled_from([0.125, 0.3, 0.5])),
        layout="btnh" if nn else draw(st.sampled_from(layouts)),
        gqa=gqa,
        softcap=0.0 if nn else draw(st.one_of(st.just(0.0), st.integers(10, 100).map(lambda c: c / 2))),
        causal=causal,
        window_left=window_left,
        window_right=window_right,
        mask_style=draw(st.sampled_from(MASK_STYLES)),
        combine=draw(st.sampled_from(COMBINES)),
        mask=draw(st.one_of(st.none(), st.sampled_from(MASK_SHAPES[:2] if nn else MASK_SHAPES))),
        bias=draw(st.one_of(st.none(), st.sampled_from(BIAS_SHAPES[:2] if nn else BIAS_SHAPES))),
        q_lengths=draw(st.booleans()),
        kv_lengths=draw(st.booleans()),
    )
    # Infinite fills only where every query row keeps a key (module docstring of attention_programs).
    empty_rows = spec.q_lengths or not structural_visibility(spec).any(axis=1).all()
    fills = [f for f in FILLS if not empty_rows or allows_empty_rows(dataclasses.replace(spec, fill=f))]
    if spec.combine == "additive":
        # A mask written as a bias is a mask only where the fill absorbs any logit (-inf, or finfo.min of an
        # 8-bit-exponent type); -1e9 stays a real bias, which is a different spec.
        fills = [f for f in fills if _absorbing(dataclasses.replace(spec, fill=f))]
        if not fills:
            spec = dataclasses.replace(spec, combine="and")
            fills = [f for f in FILLS if not empty_rows or allows_empty_rows(dataclasses.replace(spec, fill=f))]
    return dataclasses.replace(spec, fill=draw(st.sampled_from(fills)))


def _absorbing(spec: AttentionSpec) -> bool:
    fill = fill_value(spec)
    return fill == -math.inf or (spec.logits_dtype != "float16" and spec.fill == "finfo_min")


# ----- the checks --------------------------------------------------------------------------------------


def _check_attrs(spec: AttentionSpec, attrs: AttentionAttrs, strict: bool) -> None:
    """The attributes the spec determines (docs/composites.md), windows compared as visibility."""
    rel = max(4 * ROUNDOFF[spec.logits_dtype if spec.scale in ("multiply", "divide_sqrt") else spec.dtype], 1e-6)
    assert attrs.scale == pytest.approx(total_scale(spec), rel=rel), "scale"
    assert attrs.softcap == pytest.approx(spec.softcap, rel=1e-6), "softcap"
    heads = [(spec.n, spec.kv)]
    if spec.layout == "matmul" and spec.b == 1 and spec.kv == spec.n:
        # jnp.matmul drops the unit batch dim, leaving one batch-like dim: the IR cannot tell heads from
        # batch, and the composite calls it the batch (one head); both describe the same computation.
        heads.append((1, 1))
    assert (attrs.num_heads, attrs.num_kv_heads) in heads, "num_heads, num_kv_heads"
    assert attrs.decode == (spec.t <= 8 < spec.s), "decode"
    parts = {"additive": bool(spec.bias), "boolean": bool(spec.mask), "lengths": spec.q_lengths or spec.kv_lengths}
    assert set(attrs.mask_kind.split("+")) - {"none"} == {k for k, on in parts.items() if on}, "mask_kind"
    roles = {"bias": bool(spec.bias), "mask": bool(spec.mask), "q_lengths": spec.q_lengths,
             "kv_lengths": spec.kv_lengths}
    assert set(attrs.operands) - {"q", "k", "v"} == {r for r, on in roles.items() if on}, "operands"
    right, left = spec.right_bound, spec.left_bound
    # One query row: a left bound alone and a causal window are the same visibility, which is checked below.
    # Masks decided by evaluation (cumsum positions) take the fewest bounds with that visibility, so a bound
    # that the edges of S make redundant is dropped: there, too, only the visibility is the contract.
    literal = spec.t > 1 and spec.mask_style != "cumsum"
    if literal:
        assert attrs.causal == (right is not None), "causal: the program bounds keys on the right"
    if right is not None and literal:
        assert attrs.q_offset == spec.q_offset + right, "q_offset"
        assert attrs.window_left == (-1 if left is None else left + right), "window_left"
    visible = np.asarray(attention_visibility(spec.t, spec.s, causal=attrs.causal, window_left=attrs.window_left,
                                              window_right=attrs.window_right, q_offset=attrs.q_offset))
    np.testing.assert_array_equal(visible, structural_visibility(spec), err_msg="causal/window visibility")
    if spec.has_masks:
        want = fill_value(spec)
        assert attrs.masked_value == (want if math.isinf(want) else pytest.approx(want, rel=1e-2)), "fill"


def _max_error(actual: np.ndarray, oracle: np.ndarray) -> float:
    a = actual.astype(np.float64)
    assert np.array_equal(np.isnan(a), np.isnan(oracle)), "NaN positions differ from the oracle"
    finite = ~np.isnan(oracle)
    return float(np.max(np.abs(a[finite] - oracle[finite]), initial=0.0))


def _compare(spec: AttentionSpec, original: np.ndarray, fused: np.ndarray, referenced: np.ndarray,
             oracle: np.ndarray) -> None:
    if spec.dtype == "float32":
        assert_outputs_close([original], [fused])
        # The reference sums the S terms p_j * v_j in another order: the classical bound S * u * max|v|
        # (above atol 1e-6 where an output is a small sum of large terms).
        vmax = float(np.max(np.abs(oracle), initial=0.0))
        atol = max(1e-6, spec.s * ROUNDOFF["float32"] * max(vmax, 1.0) * 2)
        assert_outputs_close([original], [referenced], rtol=1e-5, atol=atol)
        np.testing.assert_allclose(original, oracle, rtol=1e-4, atol=1e-5, err_msg="generator vs its oracle")
        return
    assert_outputs_close([original], [fused])
    own = _max_error(original, oracle)
    slack = 2 * ROUNDOFF[spec.dtype] * float(np.max(np.abs(np.nan_to_num(oracle)), initial=0.0))
    for name, out in (("fused", fused), ("reference", referenced)):
        err = _max_error(out, oracle)
        assert err <= 2 * own + slack, f"{name} is {err:.3g} off the oracle; the original is {own:.3g} off"


def _check_program(spec: AttentionSpec, fn: Callable[..., jax.Array], arg_specs: list[jax.ShapeDtypeStruct],
                   args: list[np.ndarray], oracle: np.ndarray, sites: int, strict: bool = False) -> None:
    original = jax.jit(fn, keep_unused=True).lower(*arg_specs).compiler_ir("stablehlo")
    fused = clone_module(original)
    result = run_pipeline(fused, "default")
    remarks = "\n".join(str(r) for r in result.remarks)
    assert count_composites(fused) == sites, f"{spec}\nremarks:\n{remarks}"
    for attrs in attention_attrs(fused):
        try:
            _check_attrs(spec, attrs, strict)
        except AssertionError as e:
            raise AssertionError(f"{spec}\n{attrs}\n{e}") from e

    referenced = clone_module(fused)
    lowering = run_pipeline(referenced, REFERENCE)
    assert lowering.counters["attention_to_reference"] == sites
    outputs = [run_module(m, args)[0] for m in (clone_module(original), fused, referenced)]
    try:
        _compare(spec, *outputs, oracle)
    except AssertionError as e:
        raise AssertionError(f"{spec}\n{e}") from e


# ----- the properties ----------------------------------------------------------------------------------

# Split by dtype so pytest-xdist can run the three on different workers.
DTYPE_SHARE = {"float32": 0.4, "bfloat16": 0.3, "float16": 0.3}


def _settings(share: float) -> settings:
    return settings(PROFILE, max_examples=max(1, round(PROFILE.max_examples * share)))


def _one_site(spec: AttentionSpec, strict: bool = False) -> None:
    fn, arg_specs = build(spec)
    args = inputs(spec, seed=0)
    _check_program(spec, fn, arg_specs, args, expected_output(spec, args), sites=1, strict=strict)


@pytest.mark.parametrize("dtype", list(DTYPE_SHARE))
def test_generated_attention_is_fused_and_matches(dtype: str) -> None:
    @_settings(DTYPE_SHARE[dtype])
    @hypothesis_given(attention_specs(dtype))
    def prop(spec: AttentionSpec) -> None:
        _one_site(spec)

    prop()


def test_two_layers_sharing_masks_fuse_both() -> None:
    """Two attention sites over the same k, v and masks (a second layer attends from the first's output)."""

    @_settings(0.25)
    @hypothesis_given(attention_specs("float32", same_head_dims=True))
    def prop(spec: AttentionSpec) -> None:
        layer, arg_specs = build(spec)

        def two_layers(q: jax.Array, k: jax.Array, v: jax.Array, *extras: jax.Array) -> jax.Array:
            return layer(layer(q, k, v, *extras), k, v, *extras)

        args = inputs(spec, seed=1)
        first = expected_output(spec, args)
        oracle = expected_output(spec, [first, *args[1:]])
        _check_program(spec, two_layers, arg_specs, args, oracle, sites=2)

    prop()


# ----- known gaps: families the strategy leaves out or lets through, each a strict xfail ------------------
# Each entry is the smallest program of its family. When a fix lands the entry XPASSes, which fails the
# suite: drop the entry and its exclusion (or relaxation) in attention_specs / _check_attrs.

_SMALL = AttentionSpec(b=2, t=4, s=4, n=2, kv=2, h=8, d=8)

KNOWN_GAPS = {
    # Not fused: a softmax over one key; remark "the softmax does not reduce over a single key dim".
    "single_key": dataclasses.replace(_SMALL, s=1),
}


@pytest.mark.parametrize("spec", [pytest.param(spec, id=name) for name, spec in KNOWN_GAPS.items()])
@pytest.mark.xfail(strict=True, reason="known fusion gap; see the comment on its KNOWN_GAPS entry")
def test_known_gap(spec: AttentionSpec) -> None:
    _one_site(spec, strict=True)


# Gaps the differential test found and that are fixed: each stays as a regression test.
FIXED_GAPS = {
    # `q @ k.swapaxes(-1, -2)` with a unit batch dim: reshape, dot_general, then a unit broadcast_in_dim.
    "matmul_unit_batch": dataclasses.replace(_SMALL, b=1, layout="matmul"),
    # T = 1: `cols <= rows + off` is a band and `arange(T) < q_len` a q length.
    "single_query_iota": dataclasses.replace(_SMALL, t=1, s=6, causal=True, mask="ts"),
    # A bottom-right left-only window (j >= i + (S - T) - L) with S - T > L.
    "offset_left_window": dataclasses.replace(_SMALL, t=4, s=12, window_left=2),
    # where(pred, s_f16, -1e9): the fill is -1e9 converted to f16, i.e. -inf.
    "overflowing_fill": dataclasses.replace(_SMALL, dtype="float16", fill="-1e9", q_lengths=True),
    # A q scale behind a transpose, or a divide by jnp.sqrt, is folded into `scale`.
    "prescale_through_transpose": dataclasses.replace(_SMALL, scale="prescale_q", layout="bnth"),
    # jnp.repeat of k/v then a transpose to (B,N,S,H) is GQA.
    "repeat_then_transpose": dataclasses.replace(_SMALL, n=4, kv=1, gqa="repeat", layout="bnth"),
    # T = 1 and K = 1: the G query heads are heads, not query rows.
    "single_query_mqa": dataclasses.replace(_SMALL, t=1, s=11, kv=1, api="nn"),
}


@pytest.mark.parametrize("spec", [pytest.param(spec, id=name) for name, spec in FIXED_GAPS.items()])
def test_fixed_gap(spec: AttentionSpec) -> None:
    _one_site(spec, strict=True)
