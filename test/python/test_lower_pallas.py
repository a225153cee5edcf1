"""hlofuse-lower-kernels onto the Pallas kernels: cross-platform lowering and end-to-end jit runs.

target=tpu / gpu lower the kernels for a platform this host does not have, so the checks are
structural: the composite becomes Mosaic's `tpu_custom_call` or Triton's `__gpu$xla.gpu.triton`.
target=tpu-interpret / gpu-interpret run the same kernels in interpret mode, so jitted programs from
the variant catalogues (attention_variants, sampling_variants) must match the plain program here:
outputs to float tolerance for attention, the same token ids for sampling. target=gpu-mosaic lowers the
Hopper Mosaic GPU attention kernel (`mosaic_gpu_v2`); gpu-mosaic-interpret runs it in the Mosaic GPU
interpreter through a host call.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_variants import VARIANTS, Variant, lower
from jaxlib.mlir import ir
from sampling_variants import VARIANTS as SAMPLERS
from sampling_variants import lower as lower_sampler

import hlofuse
from hlofuse.kernels.nki import hostcall
from hlofuse.kernels.pallas.attention import BlockSizes, decode_attention
from hlofuse.pipeline import run_pipeline
from hlofuse.testing.modules import clone_module, count_composites

CUSTOM_CALLS = {"tpu": "tpu_custom_call", "gpu": "__gpu$xla.gpu.triton", "gpu-mosaic": "__gpu$xla.gpu.triton"}


def _composite_module(t: int = 16, s: int = 16, dtype: jnp.dtype = jnp.float32, **kwargs: object) -> ir.Module:
    """One explicit hlofuse.attention composite: q (2, T, 4, 32), k/v (2, S, 2, 32), GQA."""
    specs = [
        jax.ShapeDtypeStruct((2, t, 4, 32), dtype),
        jax.ShapeDtypeStruct((2, s, 2, 32), dtype),
        jax.ShapeDtypeStruct((2, s, 2, 32), dtype),
        jax.ShapeDtypeStruct((2,), jnp.int32),
    ]

    def f(q: jax.Array, k: jax.Array, v: jax.Array, kv_len: jax.Array) -> jax.Array:
        return hlofuse.attention(q, k, v, kv_lengths=kv_len, **kwargs)  # type: ignore[arg-type]

    return clone_module(jax.jit(f).lower(*specs).compiler_ir("stablehlo"))


def _custom_call_targets(module: ir.Module) -> list[str]:
    found: list[str] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == "stablehlo.custom_call":
            found.append(ir.StringAttr(op.attributes["call_target_name"]).value)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found


@pytest.mark.parametrize("target", ["tpu", "gpu"])
@pytest.mark.parametrize(
    "kwargs",
    [
        dict(causal=True),  # prefill
        dict(t=1, s=64, dtype=jnp.bfloat16, causal=True, q_offset=63),  # decode: split KV + combine
        dict(window=(4, 0), softcap=30.0, masked_value=-1e9),
    ],
    ids=["prefill_causal", "decode_bf16", "window_softcap"],
)
def test_lower_kernels_emits_the_platform_custom_call(target: str, kwargs: dict[str, object]) -> None:
    module = _composite_module(**kwargs)  # type: ignore[arg-type]
    result = run_pipeline(module, f"builtin.module(hlofuse-lower-kernels{{target={target}}})")
    assert result.counters[f"attention_to_{target}"] == 1, [str(r) for r in result.remarks]
    assert count_composites(module) == 0
    assert _custom_call_targets(module) == [CUSTOM_CALLS[target]]
    module.operation.verify()


@pytest.mark.parametrize(("backend", "platform"), [("tpu", "tpu"), ("gpu", "cuda")])
def test_flash_decoding_lowers_cross_platform(backend: str, platform: str) -> None:
    """The split-KV path (partial outputs, then the jnp combine) lowers for the platform too."""
    q = jax.ShapeDtypeStruct((2, 1, 8, 128), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((2, 4096, 2, 128), jnp.bfloat16)
    lengths = jax.ShapeDtypeStruct((2,), jnp.int32)
    blocks = BlockSizes(block_q=16, block_k=512, num_splits=4)

    def f(q: jax.Array, k: jax.Array, v: jax.Array, kv_len: jax.Array) -> jax.Array:
        return decode_attention(q, k, v, scale=0.1, kv_lengths=kv_len, backend=backend, block_sizes=blocks)

    text = jax.jit(f).trace(q, kv, kv, lengths).lower(lowering_platforms=(platform,)).as_text()
    assert text.count(f"stablehlo.custom_call @{CUSTOM_CALLS[backend]}(") == 1


@pytest.mark.parametrize("target", ["tpu", "gpu", "tpu-interpret", "gpu-interpret"])
@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        (dict(causal=True, masked_value=-100.0), "needs masked_value -inf or <= -10000, not -100"),
        (dict(zero_empty_rows=True, masked_value=-100.0), "needs masked_value -inf or <= -10000, not -100"),
    ],
    ids=["masked_value", "zero_empty_rows_masked_value"],
)
def test_unsupported_attributes_stay_composites_with_a_remark(target: str, kwargs: dict[str, object],
                                                              reason: str) -> None:  # fmt: skip
    module = _composite_module(**kwargs)  # type: ignore[arg-type]
    result = run_pipeline(module, f"builtin.module(hlofuse-lower-kernels{{target={target}}})")
    assert count_composites(module) == 1
    assert result.counters["attention_kept_composite"] == 1
    assert any(reason in str(remark) for remark in result.remarks), [str(r) for r in result.remarks]


def test_f16_stays_a_composite_on_tpu_only() -> None:
    for target, kept in (("tpu", 1), ("gpu", 0)):
        module = _composite_module(dtype=jnp.float16, causal=True)
        result = run_pipeline(module, f"builtin.module(hlofuse-lower-kernels{{target={target}}})")
        assert count_composites(module) == kept, [str(r) for r in result.remarks]


# ----------------------------------------------------------------------------- end to end

# Every variant of the catalogue that fuses, on both interpreters. The sites a target does not take (f16
# on the TPU) must say why, and the program must still match.
E2E = [variant.name for variant in VARIANTS if variant.sites > 0]
VARIANT_BY_NAME = {variant.name: variant for variant in VARIANTS}


@pytest.mark.parametrize("target", ["tpu-interpret", "gpu-interpret"])
@pytest.mark.parametrize("name", E2E)
def test_jit_on_the_interpreted_kernel_matches_the_plain_program(target: str, name: str) -> None:
    variant: Variant = VARIANT_BY_NAME[name]
    fused = clone_module(lower(variant).compiler_ir("stablehlo"))
    result = run_pipeline(fused, "default", target=target)
    lowered = result.counters.get(f"attention_to_{target}", 0)
    kept = [str(r) for r in result.remarks if "kept as a composite" in str(r)]
    assert lowered + len(kept) >= variant.sites, [str(r) for r in result.remarks]
    assert lowered > 0 or kept, f"{name}: neither lowered nor kept with a remark"

    options = {"hlofuse_pipeline": "default", "hlofuse_target": target, "hlofuse_strict": True}
    args = variant.args()
    got = np.asarray(jax.jit(variant.fn, compiler_options=options)(*args), np.float32)
    want = np.asarray(jax.jit(variant.fn)(*args), np.float32)
    dtype = variant.shapes[0][1]
    atol = {jnp.bfloat16: 3e-2, jnp.float16: 4e-3}.get(dtype, 1e-5)
    np.testing.assert_allclose(got, want, rtol=0 if atol > 1e-5 else 1e-5, atol=atol)


# ----------------------------------------------------------------------------- Mosaic GPU (Hopper)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(dtype=jnp.bfloat16, causal=True),
        dict(t=64, s=200, dtype=jnp.float16, window=(40, 8), softcap=30.0, q_offset=100, masked_value=-1e9),
    ],
    ids=["causal_bf16", "window_softcap_f16"],
)
def test_gpu_mosaic_emits_one_mosaic_gpu_call(kwargs: dict[str, object]) -> None:
    module = _composite_module(**kwargs)  # type: ignore[arg-type]
    result = run_pipeline(module, "builtin.module(hlofuse-lower-kernels{target=gpu-mosaic})")
    assert result.counters["attention_to_gpu-mosaic"] == 1, [str(r) for r in result.remarks]
    assert count_composites(module) == 0
    assert _custom_call_targets(module) == ["mosaic_gpu_v2"]
    module.operation.verify()


def test_gpu_mosaic_leaves_decode_to_the_triton_kernel() -> None:
    module = _composite_module(t=1, s=64, dtype=jnp.bfloat16, causal=True, q_offset=63)
    result = run_pipeline(module, "builtin.module(hlofuse-lower-kernels{target=gpu-mosaic})")
    assert result.counters["attention_to_gpu-mosaic"] == 1, [str(r) for r in result.remarks]
    assert _custom_call_targets(module) == [CUSTOM_CALLS["gpu"]]


@pytest.mark.parametrize("target", ["gpu-mosaic", "gpu-mosaic-interpret"])
@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        (dict(causal=True), "takes q, k, v all bf16 or all f16, not ['f32', 'f32', 'f32'] (wgmma would run f32"),
        (dict(dtype=jnp.bfloat16, masked_value=-100.0), "gives masked keys weight 0, which needs masked_value -inf"),
    ],
    ids=["f32", "masked_value"],
)
def test_gpu_mosaic_keeps_unsupported_composites_with_a_remark(target: str, kwargs: dict[str, object],
                                                               reason: str) -> None:  # fmt: skip
    module = _composite_module(**kwargs)  # type: ignore[arg-type]
    result = run_pipeline(module, f"builtin.module(hlofuse-lower-kernels{{target={target}}})")
    assert count_composites(module) == 1
    assert any(f"the {target} kernel {reason}" in str(remark) for remark in result.remarks), [
        str(r) for r in result.remarks
    ]


def test_gpu_mosaic_keeps_a_bias_composite_with_a_remark() -> None:
    q = jax.ShapeDtypeStruct((1, 64, 2, 64), jnp.bfloat16)
    bias = jax.ShapeDtypeStruct((1, 2, 64, 64), jnp.float32)
    lowered = jax.jit(lambda q, k, v, b: hlofuse.attention(q, k, v, bias=b)).lower(q, q, q, bias)
    module = clone_module(lowered.compiler_ir("stablehlo"))
    result = run_pipeline(module, "builtin.module(hlofuse-lower-kernels{target=gpu-mosaic})")
    assert count_composites(module) == 1
    assert any("the gpu-mosaic kernel takes no bias operand" in str(r) for r in result.remarks)


# bf16/f16 catalogue variants (the kernel takes no f32), and decode (handed to Triton flash-decoding).
MOSAIC_E2E = ("nn_causal_gqa_bf16", "all_bf16", "f16_f32_softmax", "decode_with_cache")


@pytest.mark.parametrize("name", MOSAIC_E2E)
def test_jit_on_the_interpreted_mosaic_gpu_kernel_matches_the_plain_program(name: str) -> None:
    variant: Variant = VARIANT_BY_NAME[name]
    fused = clone_module(lower(variant).compiler_ir("stablehlo"))
    result = run_pipeline(fused, "default", target="gpu-mosaic")
    assert result.counters["attention_to_gpu-mosaic"] == variant.sites, [str(r) for r in result.remarks]
    expected = "__gpu$xla.gpu.triton" if name.startswith("decode") else "mosaic_gpu_v2"
    assert _custom_call_targets(fused) == [expected] * variant.sites

    options = {"hlofuse_pipeline": "default", "hlofuse_target": "gpu-mosaic-interpret", "hlofuse_strict": True}
    args = variant.args()
    got = np.asarray(jax.jit(variant.fn, compiler_options=options)(*args), np.float32)
    assert not hostcall.last_errors()
    want = np.asarray(jax.jit(variant.fn)(*args), np.float32)
    low_precision = variant.shapes[0][1] in (jnp.bfloat16, jnp.float16)
    np.testing.assert_allclose(got, want, rtol=0 if low_precision else 1e-5, atol=3e-2 if low_precision else 1e-5)


# ----------------------------------------------------------------------------- sampling

SAMPLER_BY_NAME = {variant.name: variant for variant in SAMPLERS}


def _sample_module(dtype: jnp.dtype = jnp.float32, **kwargs: object) -> ir.Module:
    """One explicit hlofuse.sample composite over (3, 1000) logits."""
    specs = [jax.ShapeDtypeStruct((3, 1000), dtype), jax.ShapeDtypeStruct((2,), jnp.uint32)]

    def f(logits: jax.Array, key: jax.Array) -> jax.Array:
        return hlofuse.sample(logits, key, **kwargs)  # type: ignore[arg-type]

    return clone_module(jax.jit(f).lower(*specs).compiler_ir("stablehlo"))


@pytest.mark.parametrize("target", ["tpu", "gpu", "gpu-mosaic"])  # gpu-mosaic samples with the Triton kernel
@pytest.mark.parametrize(
    ("dtype", "kwargs"),
    [
        (jnp.float32, dict(temperature=0.7, top_k=40, top_p=0.9)),
        (jnp.bfloat16, dict(temperature=0.7, top_k=40)),  # rank-space top-k
    ],
    ids=["top_k_top_p", "top_k_bf16"],
)
def test_lower_kernels_emits_the_platform_custom_call_for_sampling(target: str, dtype: jnp.dtype,
                                                                    kwargs: dict[str, object]) -> None:  # fmt: skip
    module = _sample_module(dtype, **kwargs)
    result = run_pipeline(module, f"builtin.module(hlofuse-lower-kernels{{target={target}}})")
    assert result.counters[f"sample_to_{target}"] == 1, [str(r) for r in result.remarks]
    assert count_composites(module, "hlofuse.sample") == 0
    assert _custom_call_targets(module) == [CUSTOM_CALLS[target]]
    module.operation.verify()


@pytest.mark.parametrize("target", ["tpu", "gpu", "tpu-interpret", "gpu-interpret"])
@pytest.mark.parametrize(
    ("dtype", "kwargs", "reason"),
    [
        (jnp.bfloat16, dict(temperature=0.7, top_p=0.9), "does not reproduce 'top_p_mask' on bf16 logits"),
        (jnp.bfloat16, dict(temperature=1.0, min_p=0.1), "does not reproduce 'min_p' on bf16 logits"),
        (jnp.float16, dict(temperature=0.7), "takes f32 or bf16 logits, not f16"),
    ],
    ids=["top_p_bf16", "min_p_bf16", "f16"],
)
def test_unsupported_samplers_stay_composites_with_a_remark(target: str, dtype: jnp.dtype, kwargs: dict[str, object],
                                                            reason: str) -> None:  # fmt: skip
    module = _sample_module(dtype, **kwargs)
    result = run_pipeline(module, f"builtin.module(hlofuse-lower-kernels{{target={target}}})")
    assert count_composites(module, "hlofuse.sample") == 1
    assert result.counters["sample_kept_composite"] == 1
    assert any(reason in str(remark) for remark in result.remarks), [str(r) for r in result.remarks]


def _sampler_inputs(name: str) -> list[list[object]]:
    """Logits of several shapes of distribution (normal, peaked, ties, -inf entries, flat) x 2 keys."""
    variant = SAMPLER_BY_NAME[name]
    rng = np.random.default_rng(0)
    normal = rng.standard_normal(variant.shape).astype(np.float32)
    with_inf = normal.copy()
    with_inf[..., rng.random(variant.shape[-1]) < 0.3] = -np.inf
    cases = [normal, normal * 6.0, np.round(normal * 2.0) / 2.0, with_inf, np.zeros_like(normal)]
    keys = [jax.random.key_data(jax.random.PRNGKey(seed)) for seed in (0, 1)] if variant.stochastic else [None]
    return [[jnp.asarray(x, variant.dtype), *([] if key is None else [key])] for x in cases for key in keys]


# Every mode on both interpreters; the other top-k forms on the TPU one (the kernels share their passes).
SAMPLER_E2E = [(name, target) for target in ("tpu-interpret", "gpu-interpret")
               for name in ("argmax_bf16", "temperature_bf16", "jetstream_top_k", "jetstream_top_p", "min_p",
                            "top_k_then_top_p")]
SAMPLER_E2E += [("keras_top_k", "tpu-interpret"), ("maxtext_top_k_mask", "tpu-interpret"),
                ("jetstream_top_p", "gpu-mosaic-interpret")]


@pytest.mark.parametrize(("name", "target"), SAMPLER_E2E)
def test_jit_on_the_interpreted_sampler_returns_the_plain_programs_tokens(name: str, target: str) -> None:
    variant = SAMPLER_BY_NAME[name]
    fused = clone_module(lower_sampler(variant).compiler_ir("stablehlo"))
    result = run_pipeline(fused, "default", target=target)
    assert result.counters[f"sample_to_{target}"] == 1, [str(r) for r in result.remarks]

    options = {"hlofuse_pipeline": "default", "hlofuse_target": target, "hlofuse_strict": True}
    kernel, plain = jax.jit(variant.fn, compiler_options=options), jax.jit(variant.fn)
    for args in _sampler_inputs(name):
        np.testing.assert_array_equal(kernel(*args), plain(*args))
