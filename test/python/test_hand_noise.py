"""A Gumbel noise written by hand (-log(-log(u + eps) + eps) and its kin, noise.HAND_NOISES): which eps leave it
JAX's noise but where the uniform is 0 (`hand_noise_at_zero`), and the ids of a draw whose winner is a token whose
uniform is 0, where the two noises part: the original program, the composite's meaning, the CPU kernel and the fused
program lowered to it must all draw the hand-written noise's winner, not JAX's."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hlofuse.passes import fuse_sampling
from test_fuse_sampling_e2e import compile_module

from hlofuse.kernels import cpu
from hlofuse.kernels.cpu import sampling as cpu_sampling
from hlofuse.kernels.noise import HAND_NOISES, categorical_at_zero, hand_noise_at_zero
from hlofuse.kernels.sampling_reference import sample_reference
from hlofuse.pipeline import run_pipeline
from hlofuse.testing.modules import clone_module, sample_attrs

V = 4096


def _xla_noise_at_zero(noise: str, eps: float) -> float:
    """The writing's noise at u = 0 as XLA computes it on the CPU (one log rounding apart from numpy's at most)."""
    writing = HAND_NOISES[noise]
    return float(jax.jit(lambda u: writing(u, np.float32(eps), np.float32(eps), jnp))(jnp.zeros((1,), jnp.float32))[0])


@pytest.mark.parametrize("noise", sorted(HAND_NOISES))
@pytest.mark.parametrize("eps", [1e-20, 1e-30, 3e-15])
def test_a_small_eps_changes_the_noise_only_where_the_uniform_is_0(noise: str, eps: float) -> None:
    at_zero = hand_noise_at_zero(noise, eps, eps)
    assert at_zero == pytest.approx(_xla_noise_at_zero(noise, eps), rel=2e-7)
    if HAND_NOISES[noise].inner(np.float32(0.0), np.float32(eps), np) == 0:  # a bare inner log: -log(0) is +inf
        assert at_zero == -np.inf
    else:
        assert at_zero > -4.469769  # JAX's noise there is -log(-log(tiny))


@pytest.mark.parametrize(("noise", "eps", "why"), [
    ("logs_of_sums", 1e-10, "moves 16383 of the 2^23 uniforms"),  # u + 1e-10 rounds up the smallest uniforms
    ("logs_of_sums", 1e-14, "moves 1 of the 2^23 uniforms"),  # past half an ulp of 2^-23 only at 2^-23 itself
    ("torch_logs_of_sums", 7e-15, "-log(u) near 0"),  # half an ulp of the smallest -log(u)
    ("logs_of_clamps", 1e-6, "of the 2^23 uniforms"),
])
def test_an_eps_that_moves_other_noise_is_refused(noise: str, eps: float, why: str) -> None:
    with pytest.raises(ValueError, match=re.escape(why)):
        hand_noise_at_zero(noise, eps, eps)


@pytest.mark.parametrize("noise", ["unguarded_logs", "torch_log_clamped", "minus_log_plus_eps", "logs_of_clamps"])
def test_a_bare_inner_log_is_minus_inf_where_the_uniform_is_0(noise: str) -> None:
    """-log(-log(u)), whatever guards its outer log (and a clamp at 0, which guards nothing), is JAX's noise but -inf
    where u = 0: the kernels draw that too."""
    eps = 0.0 if noise == "logs_of_clamps" else 1e-20
    assert hand_noise_at_zero(noise, eps, eps) == -np.inf == _xla_noise_at_zero(noise, eps)


def _zero_uniform_site() -> tuple[np.ndarray, int]:
    """A key and a column of a (1, V) draw whose random bits have 23 zero mantissa bits (u = 0): searched over keys."""
    keys = jnp.stack([jnp.arange(4096, dtype=jnp.uint32), jnp.full((4096,), 77, jnp.uint32)], axis=-1)
    bits = jax.vmap(lambda key: jax.random.bits(key, (1, V), jnp.uint32))(keys)
    found = np.argwhere(np.asarray(bits[:, 0, :] >> 9) == 0)
    assert found.size, "no key of the 4096 has a zero uniform among its V columns"
    key_index, column = found[0]
    return np.asarray(keys[key_index]), int(column)


def _parting_logits(key: np.ndarray, column: int, at_zero: float) -> tuple[np.ndarray, int]:
    """(1, V) logits of two finite tokens: `column`, whose uniform is 0, and a rival whose perturbed score lies
    between `column`'s under JAX's noise and under the hand-written one. The rival is JAX's winner."""
    gumbel = np.asarray(jax.random.gumbel(jnp.asarray(key), (1, V), jnp.float32))[0]
    rival = (column + 1) % V
    logits = np.full((1, V), -np.inf, np.float32)
    logits[0, column] = 10.0
    between = 10.0 + (gumbel[column] + at_zero) / 2  # above 10 + JAX's noise there, below 10 + the hand-written one
    logits[0, rival] = np.float32(between - gumbel[rival])
    assert np.asarray(jax.random.categorical(jnp.asarray(key), logits))[0] == rival
    return logits, rival


def _palm_sample(x: jax.Array, key: jax.Array) -> jax.Array:
    """PaLM-jax's draw: argmax(logits + -log(-log(u + 1e-20) + 1e-20))."""
    def log(t: jax.Array) -> jax.Array:
        return jnp.log(t + 1e-20)

    return jnp.argmax(x + -log(-log(jax.random.uniform(key, x.shape, minval=0.0, maxval=1.0))), axis=-1)


def test_a_token_whose_uniform_is_0_wins_by_the_hand_written_noise_everywhere() -> None:
    key, column = _zero_uniform_site()
    at_zero = hand_noise_at_zero("logs_of_sums", 1e-20, 1e-20)
    logits, rival = _parting_logits(key, column, at_zero)
    args = (logits, key)
    specs = [jax.ShapeDtypeStruct(logits.shape, np.float32), jax.ShapeDtypeStruct((2,), np.uint32)]
    original = clone_module(jax.jit(_palm_sample).lower(*specs).compiler_ir("stablehlo"))
    want = compile_module(clone_module(original))(*args)[0]
    assert want[0] == column != rival  # the program's own draw: the hand-written noise's winner

    meaning = sample_reference(jnp.asarray(logits), jnp.asarray(key), form="categorical", gumbel_at_zero=at_zero)
    np.testing.assert_array_equal(meaning, want)
    np.testing.assert_array_equal(categorical_at_zero(at_zero)(jnp.asarray(key), jnp.asarray(logits)), want)

    fused = clone_module(original)
    run_pipeline(fused, "builtin.module(hlofuse-prepare,hlofuse-fuse-sampling)")
    (attrs,) = sample_attrs(fused)
    assert attrs.form == "categorical" and attrs.gumbel_at_zero == at_zero
    programs = {"fused": fused}
    if cpu.is_available():
        drawn = cpu_sampling.sample(jnp.asarray(logits), jnp.asarray(key), form="categorical", gumbel_at_zero=at_zero)
        np.testing.assert_array_equal(drawn, want)
        kernel = clone_module(fused)
        assert run_pipeline(kernel, "builtin.module(hlofuse-lower-kernels{target=cpu})").counters["sample_to_cpu"]
        programs["cpu"] = kernel
    for name, module in programs.items():
        np.testing.assert_array_equal(compile_module(clone_module(module))(*args)[0], want, err_msg=name)


def test_the_kernel_refuses_a_zero_noise_it_cannot_draw() -> None:
    """bf16 logits, or a value above the noise of the smallest nonzero uniform (its bucket bounds would not hold)."""
    if not cpu.is_available():
        pytest.skip("the CPU kernel is not built")
    key = jnp.zeros((2,), jnp.uint32)
    with pytest.raises(Exception, match="gumbel_at_zero"):
        cpu_sampling.sample(jnp.zeros((1, 64), jnp.bfloat16), key, form="categorical", gumbel_at_zero=-3.8)
    with pytest.raises(Exception, match="gumbel_at_zero"):
        cpu_sampling.sample(jnp.zeros((1, 64), jnp.float32), key, form="categorical", gumbel_at_zero=0.0)


@pytest.mark.parametrize("target", ["tpu-interpret", "gpu-interpret", "neuron-sim"])
def test_the_other_samplers_draw_the_hand_written_noise(target: str) -> None:
    """The Pallas kernels (in interpret mode) and the NKI kernel (emulated) draw the token whose uniform is 0, as
    the program does."""
    key, column = _zero_uniform_site()
    at_zero = hand_noise_at_zero("logs_of_sums", 1e-20, 1e-20)
    logits, rival = _parting_logits(key, column, at_zero)
    specs = [jax.ShapeDtypeStruct(logits.shape, np.float32), jax.ShapeDtypeStruct((2,), np.uint32)]
    original = clone_module(jax.jit(_palm_sample).lower(*specs).compiler_ir("stablehlo"))
    module = clone_module(original)
    run_pipeline(module, "builtin.module(hlofuse-prepare,hlofuse-fuse-sampling)")
    result = run_pipeline(module, f"builtin.module(hlofuse-lower-kernels{{target={target}}})")
    assert result.counters[f"sample_to_{target}"] == 1, [str(r) for r in result.remarks]
    got = compile_module(clone_module(module))(logits, key)[0]
    assert got[0] == column != rival


def _top_k_of_probs_palm(x: jax.Array, key: jax.Array) -> jax.Array:
    """The top 8 of softmax(x) drawn by argmax(log(values) + PaLM-jax's noise), mapped back (top_k_of_probs)."""
    values, ids = jax.lax.top_k(jax.nn.softmax(x, axis=-1), 8)

    def log(t: jax.Array) -> jax.Array:
        return jnp.log(t + 1e-20)

    pick = jnp.argmax(jnp.log(values) + -log(-log(jax.random.uniform(key, values.shape, minval=0.0, maxval=1.0))),
                      axis=-1)
    return jnp.take_along_axis(ids, pick[:, None], axis=-1)[:, 0]


def test_a_nan_row_of_a_function_form_with_a_hand_written_noise_is_the_programs() -> None:
    """top_k_of_probs on the CPU keeps its own rule for a NaN row of probabilities (id 0, lax.top_k's first) under a
    hand-written noise too: the kernel's top-k does not order NaN."""
    if not cpu.is_available():
        pytest.skip("the CPU kernel is not built")
    specs = [jax.ShapeDtypeStruct((3, 256), np.float32), jax.ShapeDtypeStruct((2,), np.uint32)]
    original = clone_module(jax.jit(_top_k_of_probs_palm).lower(*specs).compiler_ir("stablehlo"))
    kernel = clone_module(original)
    run_pipeline(kernel, "builtin.module(hlofuse-prepare,hlofuse-fuse-sampling)")
    (attrs,) = sample_attrs(kernel)
    assert attrs.form == "top_k_of_probs" and attrs.gumbel_at_zero is not None
    assert run_pipeline(kernel, "builtin.module(hlofuse-lower-kernels{target=cpu})").counters["sample_to_cpu"]
    logits = np.random.default_rng(5).standard_normal((3, 256)).astype(np.float32)
    logits[1, 17] = np.nan  # row 1's probabilities are all NaN
    run_original, run_kernel = compile_module(original), compile_module(kernel)
    for seed in range(4):
        args = (logits, np.array([seed, 3], np.uint32))
        np.testing.assert_array_equal(run_kernel(*args)[0], run_original(*args)[0], err_msg=f"seed {seed}")


def _top_k_drawn_by(noise: str):  # noqa: ANN202
    """The top 8 of x / 0.7 drawn by argmax(logits + the writing's noise of eps 1e-20) (a top-k form), or, for
    noise "unwritten", by -log(-log1p(-u)), a Gumbel noise of 1 - u, which no writing takes."""
    def sample(x: jax.Array, key: jax.Array) -> jax.Array:
        x = x / 0.7
        kept = jnp.where(x < jax.lax.top_k(x, 8)[0][:, -1:], -jnp.inf, x)
        u = jax.random.uniform(key, x.shape, minval=0.0, maxval=1.0)
        if noise == "unwritten":
            return jnp.argmax(kept + -jnp.log(-jnp.log1p(-u)), axis=-1)
        writing = HAND_NOISES[noise]
        return jnp.argmax(writing.perturbed(kept, u, 1e-20, 1e-20, jnp), axis=-1)

    return sample


def _fuse_recording_templates(sample, monkeypatch: pytest.MonkeyPatch) -> tuple[object, list[str], list[str]]:  # noqa: ANN001
    """The fused program, the noise of every form template the fusion lowered or read, and its remarks. (Not of the
    stages' templates: a stage is the logits a filter draws from, with no draw and so no noise.)"""
    lowered: list[str] = []
    text_of = fuse_sampling._template_text

    def recording(*args: object, **kwargs: object) -> object:
        if not kwargs.get("stage", args[8] if len(args) > 8 else False):
            lowered.append(str(kwargs.get("noise", args[7] if len(args) > 7 else "")))
        return text_of(*args, **kwargs)

    monkeypatch.setattr(fuse_sampling, "_template_text", recording)
    specs = [jax.ShapeDtypeStruct((2, 512), np.float32), jax.ShapeDtypeStruct((2,), np.uint32)]
    module = clone_module(jax.jit(sample).lower(*specs).compiler_ir("stablehlo"))
    result = run_pipeline(module, "builtin.module(hlofuse-prepare,hlofuse-fuse-sampling)")
    return module, lowered, [str(r) for r in result.remarks]


@pytest.mark.parametrize("noise", sorted(HAND_NOISES))
def test_a_hand_written_noise_is_matched_first_and_the_forms_lower_with_its_writing_only(
        noise: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The draw's noise is matched alone against each writing first, so the site lowers its forms with that writing
    only: not with JAX's noise (which cannot match where no JAX uniform feeds the draw), nor with the others."""
    module, lowered, remarks = _fuse_recording_templates(_top_k_drawn_by(noise), monkeypatch)
    (attrs,) = sample_attrs(module)
    assert attrs.form in ("top_k_mask", "top_k") and attrs.gumbel_at_zero == hand_noise_at_zero(noise, 1e-20, 1e-20)
    assert lowered and set(lowered) == {noise}, remarks


def test_a_noise_no_writing_takes_lowers_no_hand_written_forms(monkeypatch: pytest.MonkeyPatch) -> None:
    """-log(-log1p(-u)) is no writing of HAND_NOISES: its site lowers the forms with JAX's noise only, and its remark
    does not call the noise hand-written."""
    module, lowered, remarks = _fuse_recording_templates(_top_k_drawn_by("unwritten"), monkeypatch)
    assert not sample_attrs(module)
    assert lowered and set(lowered) == {""}
    (remark,) = [r for r in remarks if "sampler not fused" in r]
    assert "written by hand" not in remark


def test_the_remark_of_a_hand_written_noise_no_form_takes_names_its_writing(monkeypatch: pytest.MonkeyPatch) -> None:
    """PaLM-jax's top-k zeroes the other logits and their noise (they score 0, not -inf): no form; the remark names
    the noise's writing, and the closest form tried with it."""
    def palm_top_k(x: jax.Array, key: jax.Array) -> jax.Array:
        top = jax.lax.top_k(x, 8)[0][:, -1:]
        u = jax.random.uniform(key, x.shape, minval=0.0, maxval=1.0)
        noise = HAND_NOISES["logs_of_sums"](u, 1e-20, 1e-20, jnp)
        return jnp.argmax(jnp.where(x >= top, x + noise, 0.0), axis=-1)

    module, lowered, remarks = _fuse_recording_templates(palm_top_k, monkeypatch)
    assert not sample_attrs(module)
    assert set(lowered) == {"logs_of_sums"}
    (remark,) = [r for r in remarks if "sampler not fused" in r]
    assert "a Gumbel noise written by hand: logs_of_sums" in remark and "closest: `" in remark, remark


def _minus_inf_cases(key: np.ndarray, column: int) -> dict[str, np.ndarray]:
    """(1, V) logits where a noise of -inf at u = 0 (column's) decides the draw: "inf", two tokens of +inf, the earlier
    one JAX's winner, the later `column`, whose score is NaN (argmax's first NaN); "alone", only `column` finite, so
    every score is -inf and argmax takes index 0."""
    assert column > 0
    rng = np.random.default_rng(7)
    inf = rng.standard_normal((1, V)).astype(np.float32)
    inf[0, column - 1] = inf[0, column] = np.inf
    alone = np.full((1, V), -np.inf, np.float32)
    alone[0, column] = 5.0
    return {"inf": inf, "alone": alone}


def _unguarded_sample(x: jax.Array, key: jax.Array) -> jax.Array:
    """argmax(x / 0.7 - log(-log(u))), the textbook Gumbel-max with no guard."""
    u = jax.random.uniform(key, x.shape, minval=0.0, maxval=1.0)
    return jnp.argmax(x / 0.7 + -jnp.log(-jnp.log(u)), axis=-1)


def test_a_noise_of_minus_inf_at_zero_draws_the_programs_ids_on_the_cpu() -> None:
    """The CPU kernel leaves the rows a -inf noise decides to the program's own ops: a +inf logit whose uniform is 0
    (NaN, first), and a row whose every candidate drew u = 0 (all -inf: index 0), for a plain form and a top-k mask."""
    if not cpu.is_available():
        pytest.skip("the CPU kernel is not built")
    key, column = _zero_uniform_site()
    program = jax.jit(_unguarded_sample)
    for name, logits in _minus_inf_cases(key, column).items():
        want = np.asarray(program(logits, key))
        assert want[0] == (column if name == "inf" else 0)
        for form, params in (("temperature", {"temperature": 0.7}), ("top_k_mask", {"temperature": 0.7, "k": 1})):
            args = (jnp.asarray(logits), jnp.asarray(key))
            np.testing.assert_array_equal(
                sample_reference(*args, form=form, gumbel_at_zero=-np.inf, **params), want, err_msg=f"{name} {form}")
            np.testing.assert_array_equal(
                cpu_sampling.sample(*args, form=form, gumbel_at_zero=-np.inf, **params), want, err_msg=f"{name} {form}")


@pytest.mark.parametrize("target", ["cpu", "tpu-interpret", "gpu-interpret", "neuron-sim"])
def test_an_unguarded_noise_fuses_and_every_kernel_draws_the_programs_ids(target: str) -> None:
    """-log(-log(u)) fuses (gumbel_at_zero = -inf), and each kernel draws the program's ids where the -inf decides."""
    if target == "cpu" and not cpu.is_available():
        pytest.skip("the CPU kernel is not built")
    key, column = _zero_uniform_site()
    specs = [jax.ShapeDtypeStruct((1, V), np.float32), jax.ShapeDtypeStruct((2,), np.uint32)]
    original = clone_module(jax.jit(_unguarded_sample).lower(*specs).compiler_ir("stablehlo"))
    module = clone_module(original)
    run_pipeline(module, "builtin.module(hlofuse-prepare,hlofuse-fuse-sampling)")
    (attrs,) = sample_attrs(module)
    assert attrs.form == "temperature" and attrs.gumbel_at_zero == -np.inf
    result = run_pipeline(module, f"builtin.module(hlofuse-lower-kernels{{target={target}}})")
    assert result.counters[f"sample_to_{target}"] == 1, [str(r) for r in result.remarks]
    run_original, run_fused = compile_module(original), compile_module(module)
    for name, logits in _minus_inf_cases(key, column).items():
        want = run_original(logits, key)[0]
        assert want[0] == (column if name == "inf" else 0)
        np.testing.assert_array_equal(run_fused(logits, key)[0], want, err_msg=name)
