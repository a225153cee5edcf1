"""hlofuse.attention and hlofuse.sample under jax.grad, jax.jvp and jax.vmap, as the jnp code they replace."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hlofuse
from hlofuse.kernels import cpu
from hlofuse.kernels.reference import attention_reference
from hlofuse.kernels.sampling_reference import sample_reference

DEFAULT = {"hlofuse_pipeline": "default"}
needs_cpu_kernels = pytest.mark.skipif(not cpu.is_available(), reason="hlofuse CPU kernel library not built")


def _draw(seed: int, *shapes: tuple[int, ...]) -> list[jax.Array]:
    rng = np.random.default_rng(seed)
    return [jnp.asarray(rng.standard_normal(shape, np.float32)) for shape in shapes]


def _custom_calls(fn, *args, target: str) -> int:
    text = jax.jit(fn, compiler_options=DEFAULT).lower(*args).compile().as_text()
    return text.count(f'custom_call_target="{target}"')


# Keyword sets of hlofuse.attention and the matching attention_reference keywords (operands by name).
ATTENTION_KW = [
    dict(causal=True),
    dict(window=(5, 3), softcap=4.0),
    dict(causal=True, q_offset=7, masked_value=-1e9),
]


@pytest.mark.parametrize("kw", ATTENTION_KW, ids=["causal", "window-softcap", "offset-finite"])
def test_attention_gradients_are_the_references(kw):
    q, k, v, bias = _draw(0, (2, 12, 4, 16), (2, 20, 2, 16), (2, 20, 2, 8), (2, 1, 12, 20))
    lengths = jnp.array([20, 9], jnp.int32)
    ref_kw = dict(kw)
    if "window" in ref_kw:
        ref_kw["window_left"], ref_kw["window_right"] = ref_kw.pop("window")

    def loss(fn, q, k, v, bias, **extra):
        return jnp.sum(fn(q, k, v, bias=bias, kv_lengths=lengths, scale=0.3, **extra) ** 2)

    got = jax.grad(functools.partial(loss, hlofuse.attention, **kw), argnums=(0, 1, 2, 3))(q, k, v, bias)
    want = jax.grad(functools.partial(loss, attention_reference, **ref_kw), argnums=(0, 1, 2, 3))(q, k, v, bias)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
        assert float(jnp.max(jnp.abs(w))) > 0  # every operand's gradient is exercised


def test_attention_forward_mode_and_hessian_vector_products():
    q, k, v, dq = _draw(1, (1, 6, 2, 8), (1, 6, 2, 8), (1, 6, 2, 8), (1, 6, 2, 8))
    f = functools.partial(hlofuse.attention, causal=True)
    g = functools.partial(attention_reference, causal=True, scale=8**-0.5)
    out, tangent = jax.jvp(lambda q: f(q, k, v), (q,), (dq,))
    want_out, want_tangent = jax.jvp(lambda q: g(q, k, v), (q,), (dq,))
    np.testing.assert_allclose(out, want_out, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(tangent, want_tangent, rtol=1e-5, atol=1e-6)
    # forward over reverse, as Hessian-vector products take it
    hvp = jax.jvp(jax.grad(lambda q: jnp.sum(f(q, k, v) ** 3)), (q,), (dq,))[1]
    want_hvp = jax.jvp(jax.grad(lambda q: jnp.sum(g(q, k, v) ** 3)), (q,), (dq,))[1]
    np.testing.assert_allclose(hvp, want_hvp, rtol=1e-4, atol=1e-5)


@needs_cpu_kernels
def test_training_step_keeps_the_kernel_forward_and_matches_the_plain_gradients():
    q, k, v = _draw(2, (1, 64, 4, 32), (1, 64, 2, 32), (1, 64, 2, 32))

    def loss(q, k, v):
        return jnp.sum(hlofuse.attention(q, k, v, causal=True) ** 2)

    step = jax.value_and_grad(loss, argnums=(0, 1, 2))
    assert _custom_calls(step, q, k, v, target="hlofuse_attention") == 1
    (got_loss, got), (want_loss, want) = jax.jit(step, compiler_options=DEFAULT)(q, k, v), jax.jit(step)(q, k, v)
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def _per_element(fn, args, in_axes):
    """fn applied to each element along the mapped axes, stacked: what jax.vmap must reproduce."""
    size = next(a.shape[ax] for a, ax in zip(args, in_axes, strict=True) if ax is not None)
    return jnp.stack([fn(*(a if ax is None else jnp.take(a, i, ax) for a, ax in zip(args, in_axes, strict=True)))
                      for i in range(size)])


# name: in_axes over (q, k, v, bias, mask, kv_lengths), and their shapes; A = 3 is the mapped axis, B = 2.
VMAP_CASES = {
    "all-mapped": ((0, 0, 0, 0, 0, 0),
                   [(3, 2, 10, 4, 16), (3, 2, 14, 2, 16), (3, 2, 14, 2, 8), (3, 2, 4, 10, 14), (3, 2, 1, 10, 14),
                    (3, 2)]),
    "queries-mapped-shared-cache": ((0, None, None, None, None, None),
                                    [(3, 2, 10, 4, 16), (2, 14, 2, 16), (2, 14, 2, 8), (2, 4, 10, 14),
                                     (2, 1, 10, 14), (2,)]),
    "axis-1-and-a-mapped-bias-of-batch-1": ((1, 0, 0, 0, None, 1),
                                            [(2, 3, 10, 4, 16), (3, 2, 14, 2, 16), (3, 2, 14, 2, 8),
                                             (3, 1, 4, 10, 14), (1, 1, 10, 14), (2, 3)]),
    "bias-and-mask-unmapped": ((0, 0, 0, None, None, None),
                               [(3, 2, 10, 4, 16), (3, 2, 14, 2, 16), (3, 2, 14, 2, 8), (2, 4, 10, 14),
                                (2, 1, 10, 14), (2,)]),
}


def _vmap_operands(name):
    in_axes, shapes = VMAP_CASES[name]
    rng = np.random.default_rng(3)
    q, k, v, bias = (jnp.asarray(rng.standard_normal(shape, np.float32)) for shape in shapes[:4])
    mask = jnp.asarray(rng.random(shapes[4]) < 0.8)
    lengths = jnp.asarray(rng.integers(4, 15, shapes[5]), jnp.int32)
    return (q, k, v, bias, mask, lengths), in_axes


@pytest.mark.parametrize("name", VMAP_CASES)
def test_attention_under_vmap_is_one_call_over_the_folded_batch(name):
    args, in_axes = _vmap_operands(name)

    def fused(q, k, v, bias, mask, lengths):
        return hlofuse.attention(q, k, v, bias=bias, mask=mask, kv_lengths=lengths, causal=True, q_offset=4)

    def reference(q, k, v, bias, mask, lengths):
        return attention_reference(q, k, v, bias=bias, mask=mask, kv_lengths=lengths, causal=True, q_offset=4,
                                   scale=16**-0.5)

    got = jax.jit(jax.vmap(fused, in_axes=in_axes))(*args)
    want = _per_element(reference, args, in_axes)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    if cpu.is_available():
        assert _custom_calls(jax.vmap(fused, in_axes=in_axes), *args, target="hlofuse_attention") == 1
        np.testing.assert_allclose(jax.jit(jax.vmap(fused, in_axes=in_axes), compiler_options=DEFAULT)(*args), want,
                                   rtol=1e-5, atol=1e-5)


def test_attention_under_nested_vmap_and_vmap_of_grad():
    q, k, v = _draw(8, (2, 3, 1, 6, 2, 8), (2, 3, 1, 6, 2, 8), (2, 3, 1, 6, 2, 8))
    f = functools.partial(hlofuse.attention, causal=True)
    g = functools.partial(attention_reference, causal=True, scale=8**-0.5)
    np.testing.assert_allclose(jax.vmap(jax.vmap(f))(q, k, v), jax.vmap(jax.vmap(g))(q, k, v), rtol=1e-5, atol=1e-6)
    grad_f = jax.vmap(jax.grad(lambda q, k, v: jnp.sum(f(q, k, v) ** 2)))
    grad_g = jax.vmap(jax.grad(lambda q, k, v: jnp.sum(g(q, k, v) ** 2)))
    np.testing.assert_allclose(grad_f(q[0], k[0], v[0]), grad_g(q[0], k[0], v[0]), rtol=1e-5, atol=1e-6)


SAMPLERS = [dict(temperature=0.0), dict(temperature=0.8, top_k=5), dict(temperature=1.0, top_p=0.9)]


@pytest.mark.parametrize("kw", SAMPLERS, ids=["greedy", "top-k", "top-p"])
@pytest.mark.parametrize("key_mapped", [True, False], ids=["own-keys", "shared-key"])
def test_sample_under_vmap_draws_what_each_element_would(kw, key_mapped):
    logits, = _draw(9, (4, 3, 50))
    keys = jax.random.split(jax.random.PRNGKey(3), 4) if key_mapped else jax.random.PRNGKey(3)
    in_axes = (0, 0 if key_mapped else None)
    sample = jax.vmap(functools.partial(hlofuse.sample, **kw), in_axes=in_axes)
    got = jax.jit(sample)(logits, keys)
    want = _per_element(jax.jit(functools.partial(hlofuse.sample, **kw)), (logits, keys), in_axes)
    np.testing.assert_array_equal(got, want)
    if not key_mapped and kw["temperature"]:
        # a shared key gives each element the same noise; a single call over all rows would not
        assert not np.array_equal(got, jax.jit(functools.partial(hlofuse.sample, **kw))(logits, keys))
    if cpu.is_available():
        np.testing.assert_array_equal(jax.jit(sample, compiler_options=DEFAULT)(logits, keys), want)


@needs_cpu_kernels
def test_sample_under_vmap_still_runs_the_kernel():
    logits, = _draw(10, (4, 2, 64))
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    sample = jax.vmap(functools.partial(hlofuse.sample, temperature=0.7, top_k=8))
    text = jax.jit(sample, compiler_options=DEFAULT).lower(logits, keys).compile().as_text()
    assert 'custom_call_target="hlofuse_sample' in text


def test_gradients_flow_around_a_sampler():
    logits, = _draw(11, (3, 20))
    key = jax.random.PRNGKey(1)

    def picked_logit(fn, logits):
        token = fn(logits, key, temperature=1.0, top_k=4)
        return jnp.sum(jnp.take_along_axis(logits, token[:, None], axis=1))

    reference = functools.partial(sample_reference, form="top_k", p=1.0, min_p=0.0)

    def sample_like_hlofuse(logits, key, temperature, top_k):
        return reference(logits, key, temperature=temperature, k=top_k)

    got = jax.grad(functools.partial(picked_logit, hlofuse.sample))(logits)
    want = jax.grad(functools.partial(picked_logit, sample_like_hlofuse))(logits)
    np.testing.assert_array_equal(got, want)
    assert float(got.sum()) == 3.0  # one picked logit per row


@needs_cpu_kernels
def test_scanned_layers_train_with_the_kernel_forward_also_under_remat():
    """Layers in a lax.scan (as MaxText stacks them), differentiated, and under jax.checkpoint: the kernel runs
    in the loop body and the gradients are the jnp program's."""
    x, = _draw(12, (1, 32, 4, 16))
    w = 0.2 * _draw(13, (3, 16, 16))[0]

    def model(attention, w, x):
        def layer(h, wl):
            return attention(h @ wl, h, h) + h, None

        return jnp.sum(jax.lax.scan(layer, x, w)[0] ** 2)

    fused = functools.partial(model, functools.partial(hlofuse.attention, causal=True))
    plain = functools.partial(model, functools.partial(attention_reference, causal=True, scale=0.25))
    want = jax.jit(jax.grad(plain))(w, x)
    assert _custom_calls(jax.value_and_grad(fused), w, x, target="hlofuse_attention") == 1
    for fn in (fused, jax.checkpoint(fused)):
        got = jax.jit(jax.grad(fn), compiler_options=DEFAULT)(w, x)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(jnp.max(jnp.abs(want))))
