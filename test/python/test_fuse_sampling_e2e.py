"""Every sampler variant: fused to the expected form and attributes, and the same token ids as the original.

Three programs run on the same logits and keys: the original, the fused one (XLA inlines the
composite's decomposition) and the fused one lowered to the reference form rebuilt from the attributes
alone, plus the native CPU kernel where it takes the composite. Logits come in several distributions
(flat, peaked, ties, -inf entries), each over several keys: token ids must be equal, not close.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import ml_dtypes
import numpy as np
import pytest
from jax._src import compiler
from jax._src.lib import _jax as xla_client
from jaxlib.mlir import ir
from sampling_variants import VARIANTS, Variant, lower

from hlofuse.pipeline import run_pipeline
from hlofuse.testing.modules import clone_module, count_composites, sample_attrs

KEYS = 6


def compile_module(module: ir.Module) -> Callable[..., list[np.ndarray]]:
    """Compiles `module` once for the CPU; the result runs it on numpy arguments."""
    backend = jax.devices("cpu")[0].client
    device = backend.local_devices()[0]
    options = compiler.get_compile_options(num_replicas=1, num_partitions=1, backend=backend)
    executable = backend.compile_and_load(module, executable_devices=xla_client.DeviceList((device,)),
                                          compile_options=options)

    def run(*args: np.ndarray) -> list[np.ndarray]:
        buffers = [jax.device_put(np.asarray(a), device) for a in args]
        results = executable.execute_sharded(buffers).disassemble_into_single_device_arrays()
        return [np.asarray(r[0]) for r in results]

    return run


def logits_cases(shape: tuple[int, ...], dtype: np.dtype, seed: int = 0) -> dict[str, np.ndarray]:
    """Logit distributions that stress the filters and the tie rules."""
    rng = np.random.default_rng(seed)
    v = shape[-1]
    normal = rng.standard_normal(shape).astype(np.float32)
    peaked = normal * 6.0
    ties = np.round(normal * 2.0) / 2.0  # a handful of distinct values, each shared by many tokens
    with_inf = normal.copy()
    with_inf[..., rng.random(v) < 0.3] = -np.inf
    flat = np.zeros(shape, np.float32)
    cases = {"normal": normal, "peaked": peaked, "ties": ties, "neg_inf": with_inf, "flat": flat}
    return {name: x.astype(dtype) for name, x in cases.items()}



def _cpu_available() -> bool:
    from hlofuse.kernels import cpu

    return cpu.is_available()


def _cpu_kernel_module(fused: ir.Module) -> ir.Module | None:
    from hlofuse.kernels import cpu

    if not cpu.is_available():
        return None
    kernel = clone_module(fused)
    result = run_pipeline(kernel, "builtin.module(hlofuse-lower-kernels{target=cpu})")
    return kernel if result.counters["sample_to_cpu"] else None


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_variant_is_fused_and_draws_the_same_tokens(variant: Variant) -> None:
    original = lower(variant).compiler_ir("stablehlo")
    fused = clone_module(original)
    result = run_pipeline(fused, "builtin.module(hlofuse-prepare,hlofuse-fuse-sampling)")
    sites = 0 if variant.form is None else 1
    assert count_composites(fused, "hlofuse.sample") == sites, [str(r) for r in result.remarks]
    remarks = [str(r) for r in result.remarks]
    if variant.form is None:
        assert result.remarks, "a near-miss must say why it was not fused"
        assert result.counters["sampling_not_fused"] >= 1
        assert not variant.remark or any(variant.remark in r for r in remarks), remarks
        return
    if variant.remark:
        assert any(variant.remark in r for r in remarks), remarks
    else:
        assert not any("argsort" in r for r in remarks), remarks
    (attrs,) = sample_attrs(fused)
    assert attrs.form == variant.form
    assert tuple(stage.form for stage in attrs.stages) == variant.expect.get("stages", ())
    for key, want in variant.expect.items():
        got = tuple(stage.form for stage in attrs.stages) if key == "stages" else getattr(attrs, key)
        assert got == pytest.approx(want, rel=1e-6) if isinstance(want, float) else got == want, (key, got, want)

    referenced = clone_module(fused)
    lowering = run_pipeline(referenced, "builtin.module(hlofuse-lower-kernels{target=reference})")
    assert lowering.counters["sample_to_reference"] == 1
    programs = {"original": original, "fused": fused, "reference": referenced}
    kernel = _cpu_kernel_module(fused)
    if kernel is not None:
        programs["cpu"] = kernel
    if variant.expect.get("scores"):  # the CPU kernel gives back the scores too: it must take the composite
        assert kernel is not None or not _cpu_available(), "a composite with scores was not lowered to the CPU kernel"
    runs = {name: compile_module(clone_module(m)) for name, m in programs.items()}
    dtype = np.dtype(ml_dtypes.bfloat16) if variant.dtype == jax.numpy.bfloat16 else np.dtype(variant.dtype)
    for case, logits in logits_cases(variant.shape, dtype).items():
        for seed in range(KEYS if variant.stochastic else 1):
            args = [logits] + ([np.array([seed, 1000 + seed], np.uint32)] if variant.stochastic else [])
            want = runs["original"](*args)
            for name, run in runs.items():  # the ids, and what else the program returns (a log-probability)
                for got, wanted in zip(run(*args), want, strict=True):
                    np.testing.assert_array_equal(got, wanted, err_msg=f"{name} {case} seed {seed}")


def _fusion(module: ir.Module) -> tuple[list[dict], list[str]]:
    """The sample composites' attributes and the remarks (without locations) of the sampling pass."""
    result = run_pipeline(module, "builtin.module(hlofuse-prepare,hlofuse-fuse-sampling)")
    remarks = [str(r).split("remark: ", 1)[-1] for r in result.remarks]
    return [dataclasses.asdict(a) for a in sample_attrs(module)], remarks


# Each variant is lowered for one of the other platforms, tpu and cuda in turn down the catalogue: both unroll
# threefry, and the templates are lowered for each, so every platform meets every kind of sampler while each
# variant costs one lowering, fusion and two compiles (both platforms for every variant doubled this test's time).
OTHER_PLATFORMS = ("tpu", "cuda")
PLATFORM_CASES = [(variant, OTHER_PLATFORMS[i % len(OTHER_PLATFORMS)]) for i, variant in enumerate(VARIANTS)]


@pytest.mark.parametrize(("variant", "platform"), PLATFORM_CASES, ids=[f"{v.name}-{p}" for v, p in PLATFORM_CASES])
def test_variant_lowered_for_another_platform_fuses_as_for_the_cpu(variant: Variant, platform: str) -> None:
    """JAX lowers threefry as a rolled loop on the CPU and unrolled for TPU and GPU: the templates are lowered
    for each platform, so a program lowered for any of them fuses to the same composite. The module lowered for
    `platform` is portable StableHLO, so the CPU runs it: its fused and reference-lowered forms draw its tokens."""
    want = _fusion(clone_module(lower(variant).compiler_ir("stablehlo")))
    original = lower(variant, platform).compiler_ir("stablehlo")
    fused = clone_module(original)
    assert _fusion(fused) == want
    if variant.form is None:
        return
    referenced = clone_module(fused)
    assert run_pipeline(referenced, "builtin.module(hlofuse-lower-kernels{target=reference})").counters[
        "sample_to_reference"] == 1
    runs = [compile_module(clone_module(m)) for m in (original, referenced)]
    dtype = np.dtype(ml_dtypes.bfloat16) if variant.dtype == jax.numpy.bfloat16 else np.dtype(variant.dtype)
    for case in ("normal", "ties"):
        logits = logits_cases(variant.shape, dtype)[case]
        for seed in range(2 if variant.stochastic else 1):
            args = [logits] + ([np.array([seed, 77], np.uint32)] if variant.stochastic else [])
            for got, want in zip(runs[1](*args), runs[0](*args), strict=True):
                np.testing.assert_array_equal(got, want, err_msg=f"{case} seed {seed}")


def test_constants_shared_with_the_rest_of_the_program_do_not_block_fusion() -> None:
    """hlofuse-prepare inlines and CSEs the program, so a broadcast constant of the sampler (the 0 that
    take_along_axis compares indices with) can also feed another take_along_axis outside it. Only values
    computed from the logits or the key are the sampler's own."""
    import jax.numpy as jnp

    def f(logits: jax.Array, key: jax.Array, index: jax.Array) -> tuple[jax.Array, jax.Array]:
        values, ids = jax.lax.top_k(logits, 8)
        drawn = jax.random.categorical(jax.random.wrap_key_data(key), values / 0.7, axis=-1)
        token = jnp.take_along_axis(ids, drawn[..., None], axis=-1)[..., 0]
        other = jnp.take_along_axis(logits, index, axis=-1)  # shares the sampler's index constants
        return token, other

    args = (jax.ShapeDtypeStruct((1, 256), np.float32), jax.ShapeDtypeStruct((2,), np.uint32),
            jax.ShapeDtypeStruct((1, 1), np.int32))
    original = clone_module(jax.jit(f).lower(*args).compiler_ir("stablehlo"))
    module = clone_module(original)
    result = run_pipeline(module, "builtin.module(hlofuse-prepare,hlofuse-fuse-sampling)")
    assert result.counters["top_k_to_sample"] == 1, [str(r) for r in result.remarks]
    assert count_composites(module, "hlofuse.sample") == 1
    run_original, run_fused = compile_module(original), compile_module(module)
    rng = np.random.default_rng(0)
    for seed in range(KEYS):
        inputs = (rng.standard_normal((1, 256)).astype(np.float32), np.array([seed, 7], np.uint32),
                  np.array([[seed * 11]], np.int32))
        for want, got in zip(run_original(*inputs), run_fused(*inputs), strict=True):
            np.testing.assert_array_equal(got, want)


def _per_row_programs(step: Callable[..., jax.Array], vocab: int,
                      row_dtypes: tuple[type, ...]) -> tuple[ir.Module, dict[str, Callable[..., list[np.ndarray]]]]:
    """`step(logits, key, *rows)` on (3, vocab) f32 logits and (3,) per-row arguments of `row_dtypes`: the fused
    module, and the original, fused, reference-lowered and (where built) CPU-kernel programs compiled."""
    from hlofuse.kernels import cpu

    specs = [jax.ShapeDtypeStruct((3, vocab), np.float32), jax.ShapeDtypeStruct((2,), np.uint32),
             *(jax.ShapeDtypeStruct((3,), dtype) for dtype in row_dtypes)]
    original = clone_module(jax.jit(step).lower(*specs).compiler_ir("stablehlo"))
    fused = clone_module(original)
    run_pipeline(fused, "builtin.module(hlofuse-prepare,hlofuse-fuse-sampling)")
    programs = {"original": original, "fused": fused}
    for target in ("reference", "cpu"):
        lowered = clone_module(fused)
        if run_pipeline(lowered, f"builtin.module(hlofuse-lower-kernels{{target={target}}})").counters[
                f"sample_to_{target}"]:
            programs[target] = lowered
    assert "reference" in programs and ("cpu" in programs or not cpu.is_available())
    return fused, {name: compile_module(clone_module(m)) for name, m in programs.items()}


def _assert_the_originals_ids(runs: dict[str, Callable[..., list[np.ndarray]]], vocab: int, key_word: int,
                              rows_for: Callable[[], tuple[np.ndarray, ...]]) -> None:
    """Every program of `runs` gives the original's ids on each logits case, for KEYS keys, each with the per-row
    arguments `rows_for()` draws."""
    for case, logits in logits_cases((3, vocab), np.dtype(np.float32)).items():
        for seed in range(KEYS):
            args = (logits, np.array([seed, key_word], np.uint32), *rows_for())
            want = runs["original"](*args)[0]
            for name, run in runs.items():
                np.testing.assert_array_equal(run(*args)[0], want, err_msg=f"{name} {case} seed {seed}")


def test_per_row_parameters_given_as_arguments_become_the_composites_operands() -> None:
    """A serving step whose temperature and p are the batch's (B,) arguments (EasyDeL's sample_top_p_efficient):
    fused whole, the composite's operands the arguments themselves, and on the CPU kernel the ids of the original
    for other values of them, one row below the 1e-6 temperature guard."""
    import jax.numpy as jnp

    def step(logits: jax.Array, key: jax.Array, temperature: jax.Array, top_p: jax.Array) -> jax.Array:
        scaled = logits / jnp.expand_dims(jnp.where(temperature > 1e-6, temperature, 1.0), axis=-1)
        values, ids = jax.lax.top_k(scaled, 16)
        keep = (jnp.cumsum(jax.nn.softmax(values, axis=-1), axis=-1) <= jnp.expand_dims(top_p, -1)).at[..., 0].set(True)
        pick = jax.random.categorical(key, jnp.where(keep, values, -jnp.inf))
        return jnp.take_along_axis(ids, pick[..., None], axis=-1)[..., 0]

    fused, runs = _per_row_programs(step, 500, (np.float32, np.float32))
    (attrs,) = sample_attrs(fused)
    assert attrs.form == "top_p_of_top_k_rows" and attrs.k == 16
    assert " %arg0, %arg1, %arg2, %arg3 {" in str(fused)  # the composite's operands: the arguments themselves
    rng = np.random.default_rng(3)

    def rows() -> tuple[np.ndarray, ...]:
        temperature = rng.choice([0.5, 0.7, 1.0, 1e-7], 3).astype(np.float32)
        return temperature, rng.choice([0.3, 0.9, 1.0], 3).astype(np.float32)

    _assert_the_originals_ids(runs, 500, 31, rows)


def test_sglang_jax_per_row_k_p_and_min_p_given_as_arguments() -> None:
    """sglang-jax's sampler with its per-row top_ks (int32), top_ps and min_ps as the step's arguments: fused whole
    (sorted_probs_min_p_rows), the same ids as the original through the reference and the CPU kernel (whose radix
    sort replaces XLA's sort and argsort), for other values of them."""
    import jax.numpy as jnp

    def step(logits: jax.Array, key: jax.Array, top_k: jax.Array, top_p: jax.Array, min_p: jax.Array) -> jax.Array:
        probs = jax.nn.softmax(logits / 0.8, axis=-1)
        ordered, ids = jnp.sort(probs, axis=-1)[:, ::-1], jnp.argsort(probs, axis=-1)[:, ::-1]
        cumulative = jnp.cumsum(ordered, axis=-1)
        ordered = jnp.where(jnp.arange(0, probs.shape[-1]).reshape(1, -1) >= top_k.reshape(-1, 1), 0.0, ordered)
        ordered = jnp.where((cumulative - ordered) > top_p.reshape(-1, 1), 0.0, ordered)
        ordered = jnp.where(ordered < (ordered[:, 0] * min_p).reshape(-1, 1), 0.0, ordered)
        drawn = jax.random.categorical(key, ordered).reshape(-1, 1)
        return jnp.take_along_axis(ids.astype(jnp.int32), axis=1, indices=drawn).flatten()

    fused, runs = _per_row_programs(step, 400, (np.int32, np.float32, np.float32))
    (attrs,) = sample_attrs(fused)
    assert attrs.form == "sorted_probs_min_p_rows" and attrs.temperature == pytest.approx(0.8)
    rng = np.random.default_rng(5)

    def rows() -> tuple[np.ndarray, ...]:
        top_k = rng.choice([1, 5, 40, 400], 3).astype(np.int32)
        top_p, min_p = rng.choice([0.3, 0.9, 1.0], 3), rng.choice([0.0, 0.05, 0.5], 3)
        return top_k, top_p.astype(np.float32), min_p.astype(np.float32)

    _assert_the_originals_ids(runs, 400, 41, rows)


def test_tpu_inference_searched_sampler_with_per_row_arguments() -> None:
    """tpu-inference's sampler step (vLLM on TPU) with the batch's temperature, top_k (int32) and top_p as (B,)
    arguments: logits / T, the top-k and top-p masks each found by a search over float32 bits (no sort), -1e12
    fills, a categorical, and the argmax for T < 1e-5 rows. Fused whole (threshold_search_rows, the greedy argmax
    beside it), and every program gives the original's ids for other values, greedy and unfiltered rows among
    them (the CPU lowering reads both thresholds off the kernel's top candidates where that is certain)."""
    import jax.numpy as jnp

    from hlofuse.kernels.sampling_reference import search_top_k_mask, search_top_p_mask

    def step(logits: jax.Array, key: jax.Array, temperature: jax.Array, top_k: jax.Array,
             top_p: jax.Array) -> jax.Array:
        greedy = jnp.argmax(logits, axis=-1)
        x = logits / jnp.expand_dims(temperature.astype(logits.dtype), axis=-1)
        x = jnp.where(jnp.expand_dims(top_k > 0, axis=-1), search_top_k_mask(x, top_k, -1e12), x)
        x = jnp.where(jnp.expand_dims(top_p < 1.0, axis=-1), search_top_p_mask(x, top_p, -1e12), x)
        return jnp.where(temperature < 1e-5, greedy, jax.random.categorical(key, x))

    fused, runs = _per_row_programs(step, 600, (np.float32, np.int32, np.float32))
    assert sorted(attrs.form for attrs in sample_attrs(fused)) == ["greedy", "threshold_search_rows"]
    rng = np.random.default_rng(8)

    def rows() -> tuple[np.ndarray, ...]:
        temperature = rng.choice([0.0, 0.6, 1.0], 3).astype(np.float32)
        return temperature, rng.choice([0, 1, 20, 600], 3).astype(np.int32), rng.choice([0.5, 0.9, 1.0], 3).astype(
            np.float32)

    _assert_the_originals_ids(runs, 600, 53, rows)


def test_pax_temperature_per_request_given_as_an_argument() -> None:
    """Pax's top-p with the batch's temperatures as a (B,) argument, as saxml's sample_decode passes them
    (`temperature.flatten()[:, jnp.newaxis]`): fused whole (top_p_noise_scaled_rows), and on the CPU kernel the ids
    of the original for other temperatures, greedy rows (T = 0) and a row no noise bound holds for (T < 0) among
    them."""
    import jax.numpy as jnp

    def step(logits: jax.Array, key: jax.Array, temperature: jax.Array) -> jax.Array:
        ordered = jnp.sort(logits, axis=-1)
        cumulative = jnp.cumsum(jax.nn.softmax(ordered.astype(jnp.float32), axis=-1), axis=-1)
        count = jnp.sum((cumulative <= 1.0 - 0.9).astype(jnp.int32), axis=-1)
        cutoff = ordered[jnp.arange(logits.shape[0]), count]
        masked = jnp.where(logits < cutoff[:, None], -0.7 * jnp.finfo(jnp.float32).max, logits)
        noise = jax.random.gumbel(key, logits.shape).astype(logits.dtype)
        return jnp.argmax(masked + noise * temperature.flatten()[:, jnp.newaxis], axis=-1)

    fused, runs = _per_row_programs(step, 600, (np.float32,))
    (attrs,) = sample_attrs(fused)
    assert attrs.form == "top_p_noise_scaled_rows" and attrs.p == pytest.approx(0.9)
    rng = np.random.default_rng(7)

    def rows() -> tuple[np.ndarray, ...]:
        return (rng.choice([0.0, 0.5, 0.7, 1.3, -1.0], 3).astype(np.float32),)

    _assert_the_originals_ids(runs, 600, 43, rows)


def test_the_unsqueezed_ids_of_an_unfused_draw_are_left_as_they_were() -> None:
    """A draw made row by row whose (B, 1) ids the pass reshapes to (B,) for the `_choice` forms' roots, but that no
    form takes (softmax(x) squared, drawn by torch.multinomial): the module reads as before, with no reshape pair."""
    def squared_probs_multinomial(x: jax.Array, key: jax.Array) -> jax.Array:
        probs = jax.nn.softmax(x, axis=-1) ** 2
        return jax.numpy.array([jax.random.choice(key, x.shape[-1], (1,), replace=False, p=probs[i, :])
                                for i in range(x.shape[0])])

    specs = [jax.ShapeDtypeStruct((2, 64), np.float32), jax.ShapeDtypeStruct((2,), np.uint32)]
    module = clone_module(jax.jit(squared_probs_multinomial).lower(*specs).compiler_ir("stablehlo"))
    prepared = clone_module(module)
    run_pipeline(prepared, "builtin.module(hlofuse-prepare)")
    result = run_pipeline(module, "builtin.module(hlofuse-prepare,hlofuse-fuse-sampling)")
    assert count_composites(module, "hlofuse.sample") == 0
    assert any("sampler not fused" in str(r) for r in result.remarks)
    assert str(module) == str(prepared)


@pytest.mark.parametrize("min_p", [0.3, 0.05, 0.7, 1e-3])
@pytest.mark.parametrize("log", ["constant", "op"])
def test_min_p_in_logit_space_keeps_a_token_exactly_at_its_threshold(min_p: float, log: str) -> None:
    """A min-p in logit space keeps `y >= max(y) + log(min_p)`: a token exactly at the threshold stays and the next
    float below goes. The composite carries min_p (exp of the program's constant log(min_p), or the constant whose
    log the program takes), from which the kernel's threshold must come back to the bit: the original, the fused
    program and the CPU kernel draw the same ids, the token at the threshold among them and the one below never."""
    import math

    import jax.numpy as jnp

    log_fn = math.log if log == "constant" else jnp.log

    def sampler(x: jax.Array, key: jax.Array) -> jax.Array:
        return jax.random.categorical(key, jnp.where(x >= jnp.max(x, -1, keepdims=True) + log_fn(min_p), x, -jnp.inf))

    offset = np.float32(math.log(min_p)) if log == "constant" else np.asarray(jnp.log(np.float32(min_p)))
    logits = np.full((4, 512), -60.0, np.float32)
    logits[:, 3] = 2.5
    threshold = np.float32(np.float32(2.5) + offset)
    logits[:, 100], logits[:, 200] = threshold, np.nextafter(threshold, np.float32(-np.inf))
    original = clone_module(jax.jit(sampler).lower(jax.ShapeDtypeStruct(logits.shape, np.float32),
                                                   jax.ShapeDtypeStruct((2,), np.uint32)).compiler_ir("stablehlo"))
    fused = clone_module(original)
    run_pipeline(fused, "builtin.module(hlofuse-prepare,hlofuse-fuse-sampling)")
    (attrs,) = sample_attrs(fused)
    assert attrs.form == ("min_p_log_constant_mask" if log == "constant" else "min_p_log_mask")
    programs = {"original": original, "fused": fused}
    kernel = _cpu_kernel_module(fused)
    if kernel is not None:
        programs["cpu"] = kernel
    runs = {name: compile_module(clone_module(m)) for name, m in programs.items()}
    drawn = set()
    for seed in range(24):
        key = np.array([seed, 5], np.uint32)
        (want,) = runs["original"](logits, key)
        drawn |= set(want.tolist())
        for name, run in runs.items():
            np.testing.assert_array_equal(run(logits, key)[0], want, err_msg=f"{name} seed {seed}")
    assert 200 not in drawn and (100 in drawn or min_p < 0.01), drawn
