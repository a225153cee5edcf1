"""hlofuse-lower-kernels onto the NKI kernels: target=neuron-sim end to end, target=neuron without the SDK.

target=neuron-sim runs the NKI kernels on this host (the emulator, or NKI's simulator where neuronxcc
imports) through a CPU custom call, so jitted programs from the attention and sampling catalogues must
match the plain program (sampling: the same token ids for the same key). target=neuron needs the
Neuron SDK; without it the pass fails with a message saying how to install it (hlofuse-opt: one error
line; jax.jit: a fallback warning and the original program, an error under hlofuse_strict).
"""

from __future__ import annotations

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sampling_variants
from attention_variants import VARIANTS, Variant, lower

import hlofuse
from hlofuse.jax.hook import HlofuseCompileError, HlofuseFallbackWarning
from hlofuse.kernels.nki import hostcall, sampling
from hlofuse.kernels.nki.attention import HAVE_NEURONXCC
from hlofuse.pipeline import PassFailure, run_pipeline
from hlofuse.testing.modules import clone_module, count_composites

E2E = ("causal_tril_inf", "nn_causal_gqa_bf16", "nn_bias_lengths_window", "decode_with_cache", "sliding_window")
VARIANT_BY_NAME = {variant.name: variant for variant in VARIANTS}


@pytest.mark.parametrize("name", E2E)
def test_jit_on_neuron_sim_matches_the_plain_program(name: str) -> None:
    variant: Variant = VARIANT_BY_NAME[name]
    fused = clone_module(lower(variant).compiler_ir("stablehlo"))
    result = run_pipeline(fused, "default", target="neuron-sim")
    assert result.counters["attention_to_neuron-sim"] == variant.sites, [str(r) for r in result.remarks]

    options = {"hlofuse_pipeline": "default", "hlofuse_target": "neuron-sim", "hlofuse_strict": True}
    args = variant.args()
    got = np.asarray(jax.jit(variant.fn, compiler_options=options)(*args), np.float32)
    assert not hostcall.last_errors()
    want = np.asarray(jax.jit(variant.fn)(*args), np.float32)
    low_precision = variant.shapes[0][1] == jnp.bfloat16
    np.testing.assert_allclose(got, want, rtol=0 if low_precision else 1e-5, atol=3e-2 if low_precision else 1e-5)


def _composite_module(**kwargs: object) -> object:
    specs = [jax.ShapeDtypeStruct((2, 16, 4, 32), jnp.float32), jax.ShapeDtypeStruct((2, 16, 2, 32), jnp.float32),
             jax.ShapeDtypeStruct((2, 16, 2, 32), jnp.float32)]  # fmt: skip

    def f(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return hlofuse.attention(q, k, v, **kwargs)  # type: ignore[arg-type]

    return jax.jit(f).lower(*specs)


def test_neuron_sim_keeps_unsupported_composites_with_a_remark() -> None:
    module = clone_module(_composite_module(zero_empty_rows=True, causal=True, masked_value=-30.0)
                          .compiler_ir("stablehlo"))
    result = run_pipeline(module, "builtin.module(hlofuse-lower-kernels{target=neuron-sim})")
    assert count_composites(module) == 1
    assert any("does not take this composite: zero_empty_rows with masked_value -30 above -10000" in str(r)
               for r in result.remarks), [str(r) for r in result.remarks]


@pytest.mark.skipif(HAVE_NEURONXCC, reason="neuronxcc imports here: target=neuron lowers the kernel")
def test_neuron_without_the_sdk_fails_the_pass_with_the_install_message() -> None:
    lowered = _composite_module(causal=True)
    module = clone_module(lowered.compiler_ir("stablehlo"))
    expected = r"target 'neuron' cannot lower 1 composite\(s\) here: .*pip install neuronx-cc"
    with pytest.raises(PassFailure, match=expected):
        run_pipeline(module, "builtin.module(hlofuse-lower-kernels{target=neuron})")


@pytest.mark.skipif(HAVE_NEURONXCC, reason="neuronxcc imports here: target=neuron lowers the kernel")
def test_hlofuse_opt_exits_with_the_install_message_and_no_traceback(tmp_path: object) -> None:
    path = tmp_path / "attention.mlir"  # type: ignore[operator]
    path.write_text(_composite_module(causal=True).as_text())
    cli = [sys.executable, "-m", "hlofuse.tools.opt", str(path), "--hlofuse-lower-kernels=target=neuron"]
    run = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, run.stderr
    assert "no neuron kernel without the Neuron SDK" in run.stderr and "pip install neuronx-cc" in run.stderr
    assert "Traceback" not in run.stderr
    assert run.stdout == ""


@pytest.mark.skipif(HAVE_NEURONXCC, reason="neuronxcc imports here: target=neuron lowers the kernel")
def test_jit_with_the_neuron_target_and_no_sdk_warns_and_runs_the_original() -> None:
    """target=neuron without the SDK is a failed hlofuse compile: a warning naming the missing SDK and the
    original program, or HlofuseCompileError under hlofuse_strict."""
    def f(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        s = jnp.einsum("btnh,bsnh->bnts", q, k) * 0.25
        return jnp.einsum("bnts,bsnd->btnd", jax.nn.softmax(s, axis=-1), v)

    q = jax.random.normal(jax.random.key(0), (1, 16, 2, 16), jnp.float32)
    options = {"hlofuse_pipeline": "default", "hlofuse_target": "neuron"}
    with pytest.warns(HlofuseFallbackWarning, match="hlofuse-lower-kernels.*pip install neuronx-cc"):
        got = jax.jit(f, compiler_options=options)(q, q, q)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(jax.jit(f)(q, q, q)))
    with pytest.raises(HlofuseCompileError, match="Neuron SDK"):
        jax.jit(f, compiler_options={**options, "hlofuse_strict": True})(q, q, q)


# ----------------------------------------------------------------------------- sampling

SAMPLERS = [v for v in sampling_variants.VARIANTS if v.form is not None]


def _nki_takes(variant: sampling_variants.Variant) -> bool:
    dtype = jnp.dtype(variant.dtype).name
    return variant.form in sampling.KERNEL_FORMS and (dtype == "float32" or variant.form not in sampling.F32_ONLY_FORMS)


@pytest.mark.parametrize("variant", SAMPLERS, ids=[v.name for v in SAMPLERS])
def test_sampler_on_neuron_sim_returns_the_programs_tokens(variant: sampling_variants.Variant) -> None:
    module = clone_module(sampling_variants.lower(variant).compiler_ir("stablehlo"))
    result = run_pipeline(module, "default", target="neuron-sim")
    remarks = [str(r) for r in result.remarks]
    if _nki_takes(variant):
        assert result.counters["sample_to_neuron-sim"] == 1, remarks
    else:  # stays a composite, saying why; XLA inlines the original (its execution: test_fuse_sampling_e2e)
        assert result.counters["sample_kept_composite"] == 1, remarks
        assert any("the neuron-sim sampler does not take this composite" in r for r in remarks), remarks
        return

    options = {"hlofuse_pipeline": "default", "hlofuse_target": "neuron-sim", "hlofuse_strict": True}
    fused, plain = jax.jit(variant.fn, compiler_options=options), jax.jit(variant.fn)
    rng = np.random.default_rng(0)
    for seed, x in enumerate((rng.standard_normal(variant.shape) * 3, np.round(rng.standard_normal(variant.shape)))):
        args = [jnp.asarray(x, variant.dtype)]
        if variant.stochastic:
            args.append(jnp.array([seed, 2024 + seed], jnp.uint32))
        np.testing.assert_array_equal(fused(*args), plain(*args), err_msg=f"input {seed}")
        assert not hostcall.last_errors()


def _sample_module(**kwargs: object) -> object:
    def f(x: jax.Array, key: jax.Array) -> jax.Array:
        return hlofuse.sample(x, key, **kwargs)  # type: ignore[arg-type]

    return jax.jit(f).lower(jax.ShapeDtypeStruct((4, 256), jnp.float32), jax.ShapeDtypeStruct((2,), jnp.uint32))


@pytest.mark.skipif(HAVE_NEURONXCC, reason="neuronxcc imports here: target=neuron lowers the kernel")
def test_neuron_without_the_sdk_fails_on_a_sample_composite_too() -> None:
    module = clone_module(_sample_module(temperature=0.7, top_p=0.9).compiler_ir("stablehlo"))
    with pytest.raises(PassFailure, match="no neuron kernel without the Neuron SDK"):
        run_pipeline(module, "builtin.module(hlofuse-lower-kernels{target=neuron})")
    assert count_composites(module, "hlofuse.sample") == 1
