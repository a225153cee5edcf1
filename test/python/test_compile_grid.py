"""The compile grid: every kernel hlofuse emits, compiled by the chip's own compiler on this CPU-only host.

Every fusing attention variant (attention_variants.py), every sampler form (sampling_variants.py) and the
long-context shapes (prefill to T = 32k, decode against a 128k cache, head dims 64/128/256, bf16 and f32)
are lowered by the default pipeline for tpu on v5e and v6e (a sampler variant on one of the two, in turn), and
for gpu (Triton) and gpu-mosaic on the H100 target config. Each kernel call is compiled alone
(hlofuse.compile_targets) and must compile within the chip's memory, with no ptxas spills on the GPU; or the
lowering must have refused it with a remark
(`kept as a composite: ...`), as it does for tiles that do not fit (hlofuse.kernels.pallas.resources).

No TPU kernel may spill vector registers to VMEM either. The attention tiles are chosen among those libtpu
compiled without spills (tpu_bundles.json; docs/kernels-pallas.md, "TPU tiles, and the spills"), and the
resource model (`tpu.vmem_bytes`, an upper bound) must cover what libtpu allocates. The sampler's lane tiles
hold at most 6 vregs (sampling.TPU_TILE_ELEMENTS); every form it takes is compiled at real vocabularies
(32000, 128256, 256000) for v5e, v6e and v5p, and for the H100 (Triton).

The compilers come with `pip install -e ".[accelerators]"` (./test.sh installs them for the full tier and
sets HLOFUSE_REQUIRE_COMPILERS=1, so that a missing compiler fails instead of skipping). The whole grid is
slow (test/conftest.py's SLOW table); the fast tier keeps a few cases of each part (FAST_SAMPLES).
"""

from __future__ import annotations

import importlib.util
import os

import jax
import jax.numpy as jnp
import pytest
from attention_variants import VARIANTS, Variant
from attention_variants import lower as lower_attention
from jaxlib.mlir import ir
from sampling_variants import VARIANTS as SAMPLERS
from sampling_variants import lower as lower_sampler

from hlofuse import compile_targets as ct
from hlofuse.kernels.pallas import attention as pallas_attention
from hlofuse.kernels.pallas import resources
from hlofuse.kernels.pallas import sampling as pallas_sampling
from hlofuse.kernels.sampling_reference import FORMS as SAMPLING_FORMS
from hlofuse.kernels.sampling_reference import form_params, sample_reference
from hlofuse.ops.sample import SAMPLE, SAMPLE_VERSION
from hlofuse.pipeline import run_pipeline
from hlofuse.testing.modules import clone_module


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


HAVE = {"tpu": _installed("libtpu"), "cuda": _installed("jax_plugins.xla_cuda12") and ct.find_ptxas() is not None}
REQUIRED = os.environ.get("HLOFUSE_REQUIRE_COMPILERS") == "1"
# libtpu reads its dump flags once, when it loads: ask for the dumps before any test of this worker does.
for _name in ("tpu-v5e", "tpu-v6e", "h100"):
    if HAVE[ct.chip(_name).platform]:
        ct.prepare(_name, cpu_backends=True)

# (chip, kernel target) pairs of the grid.
TARGETS = (("tpu-v5e", "tpu"), ("tpu-v6e", "tpu"), ("h100", "gpu"), ("h100", "gpu-mosaic"))
SAMPLER_TARGETS = (("tpu-v5e", "tpu"), ("tpu-v6e", "tpu"), ("h100", "gpu"))  # gpu-mosaic samples as gpu


def _need(chip_name: str) -> None:
    platform = ct.chip(chip_name).platform
    if not HAVE[platform]:
        extra = "tpu" if platform == "tpu" else "cuda12"
        message = f'{chip_name}: its compiler is not installed (pip install -e ".[{extra}]")'
        if REQUIRED:
            pytest.fail(message + "; HLOFUSE_REQUIRE_COMPILERS=1")
        pytest.skip(message)


def _lowered_for(module: ir.Module, chip_name: str, kernel_target: str) -> tuple[ir.Module, list[str]]:
    with module.context, ir.Location.unknown(), resources.for_chip(chip_name):
        result = run_pipeline(module, "default", target=kernel_target)
    return module, [str(remark) for remark in result.remarks]


def check_compiles(module: ir.Module, remarks: list[str], chip_name: str, sites: int) -> list[ct.KernelReport]:
    """Every kernel call compiles within the chip's memory and without spills; every site is a kernel call or
    kept with a remark."""
    reports = ct.check_kernels(module, chip_name)
    kept = [remark for remark in remarks if "kept as a composite" in remark]
    assert len(reports) + len(kept) >= sites, remarks
    limits = resources.CHIPS[chip_name]
    for report in reports:
        assert report.ok, f"{report.name} failed on {chip_name}: {report.error}"
        used = report.resources
        if limits.backend == "gpu":
            assert used.get("spill_store_bytes", 0) == 0 and used.get("spill_load_bytes", 0) == 0, used
            assert used.get("shared_memory_bytes", 0) <= limits.smem_per_block, used
        elif "vmem_bytes" in used:
            assert used["vmem_bytes"] <= resources.tpu_vmem_limit(limits), used
            assert used.get("vmem_spill_bytes", 0) == 0, f"{report.name} spills on {chip_name}: {used}"
    return reports


# ----------------------------------------------------------------------------- the catalogues

ATTENTION = [variant for variant in VARIANTS if variant.sites > 0]


@pytest.mark.parametrize(("chip_name", "kernel_target"), TARGETS, ids=[f"{c}-{t}" for c, t in TARGETS])
@pytest.mark.parametrize("variant", ATTENTION, ids=[v.name for v in ATTENTION])
def test_attention_variant_compiles_or_is_refused(variant: Variant, chip_name: str, kernel_target: str) -> None:
    _need(chip_name)
    lowered = lower_attention(variant).compiler_ir("stablehlo")
    module, remarks = _lowered_for(clone_module(lowered), chip_name, kernel_target)
    check_compiles(module, remarks, chip_name, variant.sites)


# One variant of each kernel the catalogue's samplers lower to: variants of one form, dtype and shape emit the same
# kernel call, whatever writing they were fused from, but for a hand-written noise's (test_fuse_sampling_e2e.py
# checks that each writing fuses, also lowered for tpu and cuda). Each for the GPU and for one TPU chip, v5e and v6e
# in turn: at the catalogue's shapes a sampler's tiles are the same on both (its lane tiles do not depend on the
# chip's VMEM); the chips' limits are tested at real vocabularies below, for every form on v5e, v6e and v5p.
_KERNELS: dict[tuple[object, ...], object] = {}
for _variant in SAMPLERS:
    if _variant.form is not None:  # (a hand-written noise's kernel draws another value where the uniform is 0)
        _hand_noise = "gumbel_at_zero" in _variant.expect
        _KERNELS.setdefault((_variant.form, _variant.dtype, _variant.shape, _hand_noise), _variant)
SAMPLER_FORMS = list(_KERNELS.values())
TPU_SAMPLER_TARGETS = [target for target in SAMPLER_TARGETS if target[1] == "tpu"]
SAMPLER_CASES = [(variant, *target) for i, variant in enumerate(SAMPLER_FORMS)
                 for target in (TPU_SAMPLER_TARGETS[i % len(TPU_SAMPLER_TARGETS)],
                                *(t for t in SAMPLER_TARGETS if t[1] != "tpu"))]


@pytest.mark.parametrize(("variant", "chip_name", "kernel_target"), SAMPLER_CASES,
                         ids=[f"{v.name}-{c}-{t}" for v, c, t in SAMPLER_CASES])
def test_sampler_form_compiles_or_is_refused(variant: object, chip_name: str, kernel_target: str) -> None:
    _need(chip_name)
    platform = ct.chip(chip_name).platform
    lowered = lower_sampler(variant, platform).compiler_ir("stablehlo")  # type: ignore[arg-type]
    module, remarks = _lowered_for(clone_module(lowered), chip_name, kernel_target)
    check_compiles(module, remarks, chip_name, 1)


# ----------------------------------------------------------------------------- the sampler at real vocabularies

PALLAS_FORMS = [(form, dtype) for form in pallas_sampling.FORMS for dtype in pallas_sampling.DTYPES
                if not (dtype == "bf16" and form in pallas_sampling.BF16_UNSUPPORTED)]
VOCABULARIES = (32000, 128256, 256000)  # Llama 2, Llama 3, Gemma
VOCABULARY_TARGETS = (("tpu-v5e", "tpu"), ("tpu-v6e", "tpu"), ("tpu-v5p", "tpu"), ("h100", "gpu"))


def _form_module(form: str, dtype: str, rows: int, vocab: int) -> ir.Module:
    """One `hlofuse.sample` composite of `form` on (rows, vocab) logits (k = 50, p = 0.95, min-p 0.1, T = 0.7
    where the form reads them), its decomposition the form's reference."""
    params = form_params(form, temperature=0.7, k=50, p=0.95, min_p=0.1)
    attributes = {"mode": SAMPLING_FORMS[form].mode, "form": form, "temperature": 1.0, "k": 0, "p": 1.0,
                  "min_p": 0.0, **params}

    def decomposition(*values: jax.Array, **attrs: object) -> jax.Array:
        return sample_reference(values[0], values[1] if len(values) > 1 else None, form=form, **params)

    composite = jax.lax.composite(decomposition, SAMPLE, SAMPLE_VERSION)
    args = [jax.ShapeDtypeStruct((rows, vocab), {"bf16": jnp.bfloat16, "f32": jnp.float32}[dtype])]
    if SAMPLING_FORMS[form].stochastic:
        args.append(jax.ShapeDtypeStruct((2,), jnp.uint32))
    lowered = jax.jit(lambda *values: composite(*values, **attributes)).lower(*args)
    return clone_module(lowered.compiler_ir("stablehlo"))


@pytest.mark.parametrize(("chip_name", "kernel_target"), VOCABULARY_TARGETS,
                         ids=[f"{c}-{t}" for c, t in VOCABULARY_TARGETS])  # fmt: skip
@pytest.mark.parametrize("vocab", VOCABULARIES)
@pytest.mark.parametrize(("form", "dtype"), PALLAS_FORMS, ids=[f"{f}-{d}" for f, d in PALLAS_FORMS])
def test_sampler_at_real_vocabularies_compiles_without_spills(form: str, dtype: str, vocab: int, chip_name: str,
                                                             kernel_target: str) -> None:  # fmt: skip
    # 8 x 3200 f32 lane tiles spilled 57-356 KiB of vregs on every TPU; the kernel must take every one of these.
    _need(chip_name)
    module, remarks = _lowered_for(_form_module(form, dtype, 8, vocab), chip_name, kernel_target)
    (report,) = check_compiles(module, remarks, chip_name, 1)
    assert report.name.startswith("hlofuse_sample"), report


# ----------------------------------------------------------------------------- long contexts


Long = ct.AttentionCase  # q (B, T, N, H) against k, v (B, S, K, H); the table's cases are of the same kind


def _id(case: Long) -> str:
    return case.label.replace(" ", "-")


LONG = [
    *(Long(dtype, 1, 32768, 32768, 8, 8, h) for dtype in ("bf16", "f32") for h in (64, 128, 256)),
    *(Long(dtype, 1, 8192, 8192, 32, 8, h) for dtype in ("bf16", "f32") for h in (128, 256)),
    *(Long(dtype, 4, 1, 131072, 32, 8, h, causal=False) for dtype in ("bf16", "f32") for h in (64, 128, 256)),
]


def _long_module(case: Long) -> ir.Module:
    import hlofuse

    dtype = jnp.dtype({"bf16": "bfloat16", "f32": "float32"}[case.dtype])

    def attend(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        offset = case.s - case.t  # bottom-right causal: the queries are the last T positions
        return hlofuse.attention(q, k, v, causal=case.causal, q_offset=offset if case.causal else 0)

    q = jax.ShapeDtypeStruct((case.b, case.t, case.n, case.h), dtype)
    kv = jax.ShapeDtypeStruct((case.b, case.s, case.k, case.h), dtype)
    return clone_module(jax.jit(attend).lower(q, kv, kv).compiler_ir("stablehlo"))


@pytest.mark.parametrize(("chip_name", "kernel_target"), TARGETS, ids=[f"{c}-{t}" for c, t in TARGETS])
@pytest.mark.parametrize("case", LONG, ids=[_id(case) for case in LONG])
def test_long_context_compiles_or_is_refused(case: Long, chip_name: str, kernel_target: str) -> None:
    _need(chip_name)
    module, remarks = _lowered_for(_long_module(case), chip_name, kernel_target)
    reports = check_compiles(module, remarks, chip_name, 1)
    if not reports:
        return
    # The resource model covers what the compiler allocated for the chosen tiles.
    (report,) = reports
    dtype = {"bf16": jnp.bfloat16, "f32": jnp.float32}[case.dtype]
    q = jax.ShapeDtypeStruct((case.b, case.t, case.n, case.h), dtype)
    kv = jax.ShapeDtypeStruct((case.b, case.s, case.k, case.h), dtype)
    decode = case.t <= pallas_attention.DECODE_MAX_T < case.s
    backend = "tpu" if kernel_target == "tpu" else "gpu"
    if report.target != ("tpu_custom_call" if backend == "tpu" else "__gpu$xla.gpu.triton"):
        return  # Mosaic GPU: its shared memory is exact by construction (mosaic_gpu.smem_bytes)
    blocks = pallas_attention.chip_blocks(backend, q, kv, kv, decode=decode, chip=resources.CHIPS[chip_name],
                                          causal_offset=case.s - case.t if case.causal else None)  # fmt: skip
    plan = pallas_attention._plan(backend, q, kv, kv, blocks, pallas_attention._NO_ATTRS)
    itemsize = jnp.dtype(dtype).itemsize
    if backend == "gpu":
        model = resources.triton_smem_bytes(plan.block_q, plan.block_k, plan.head_pad, plan.value_pad, itemsize,
                                            blocks.num_warps, blocks.num_stages)  # fmt: skip
        assert report.resources["shared_memory_bytes"] <= model, (report.resources, model, plan)
    elif "vmem_bytes" in report.resources:
        from hlofuse.kernels.pallas import tpu

        assert report.resources["vmem_bytes"] <= tpu.vmem_bytes(plan, itemsize), (report.resources, plan)


@pytest.mark.parametrize(("chip_name", "kernel_target"), TARGETS, ids=[f"{c}-{t}" for c, t in TARGETS])
@pytest.mark.parametrize("dtype", ["bf16", "f32"])
@pytest.mark.parametrize("h", [128, 256])
def test_bias_and_mask_at_4k_compile_or_are_refused(h: int, dtype: str, chip_name: str, kernel_target: str) -> None:
    # The side operands add a (block_q, block_k) tile each: TPU VMEM near 20 MiB at f32 H = 256 (the kernel
    # asks for 32 MiB), and Triton's registers near its cap; gpu-mosaic takes no bias or mask (a remark).
    import hlofuse

    _need(chip_name)
    jdtype = {"bf16": jnp.bfloat16, "f32": jnp.float32}[dtype]
    t = 4096

    def attend(q: jax.Array, k: jax.Array, v: jax.Array, bias: jax.Array, mask: jax.Array) -> jax.Array:
        return hlofuse.attention(q, k, v, bias=bias, mask=mask, causal=True)

    specs = [jax.ShapeDtypeStruct((1, t, 8, h), jdtype)] * 3
    specs += [jax.ShapeDtypeStruct((1, 8, t, t), jnp.float32), jax.ShapeDtypeStruct((1, 1, t, t), jnp.bool_)]
    module = clone_module(jax.jit(attend).lower(*specs).compiler_ir("stablehlo"))
    module, remarks = _lowered_for(module, chip_name, kernel_target)
    check_compiles(module, remarks, chip_name, 1)


# ----------------------------------------------------------------------------- refusals


def test_a_head_dim_no_triton_tile_fits_is_refused_with_the_limit() -> None:
    # f32 with H = 1024: even 16 x 16 tiles hold too many registers; no compiler is needed to refuse it.
    case = Long("f32", 1, 1024, 1024, 8, 8, 1024)
    module, remarks = _lowered_for(_long_module(case), "h100", "gpu")
    assert not ct.kernel_calls(module)
    assert any("kept as a composite: the gpu kernel with its smallest tiles (16 x 16)" in r for r in remarks), remarks


def test_mosaic_gpu_refuses_a_value_dim_that_would_spill() -> None:
    module, remarks = _lowered_for(_long_module(Long("bf16", 1, 1024, 1024, 8, 8, 256)), "h100", "gpu-mosaic")
    assert not ct.kernel_calls(module)
    assert any("registers per thread > 192 (above that ptxas spills on h100)" in r for r in remarks), remarks
