"""Threads compiling samplers and attention through the real default pipeline at the same time.

A pass that keeps state in a module global shares it between concurrent compiles: fuse-sampling once
kept its parsed templates in a module-level list that every run cleared at its end, so one thread's
clear freed the templates another thread was still matching, and the process died (SIGSEGV). Each
compile here runs in strict mode (a pass failure raises instead of falling back), must fuse its site,
and must give the plain program's results.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np

from hlofuse import pipeline

# Each job's first compile of its shape lowers the sampling templates (seconds); two rounds of four threads
# matching at once are enough to meet one thread's templates freed under another's feet.
ROUNDS = 2
THREADS = 4
OPTIONS = {"hlofuse_pipeline": "default", "hlofuse_strict": True}


def _top_k_sampler(k: int):
    def sample(logits, key):
        values, ids = jax.lax.top_k(logits / 0.7, k)
        choice = jax.random.categorical(key, values)
        return jnp.take_along_axis(ids, choice[:, None], axis=-1)[:, 0]

    return sample


def _top_p_sampler(p: float):
    def sample(logits, key):
        scaled = logits / 0.8
        order = jnp.argsort(-scaled, axis=-1)
        ranked = jnp.take_along_axis(scaled, order, axis=-1)
        probs = jax.nn.softmax(ranked, axis=-1)
        keep = jnp.cumsum(probs, axis=-1) - probs < p
        cutoff = jnp.min(jnp.where(keep, ranked, jnp.inf), axis=-1, keepdims=True)
        return jax.random.categorical(key, jnp.where(scaled < cutoff, -jnp.inf, scaled))

    return sample


def _attention(q, k, v):
    scores = jnp.einsum("btnh,bsnh->bnts", q, k) / 8.0
    return jnp.einsum("bnts,bsnh->btnh", jax.nn.softmax(scores, axis=-1), v)


def _compile_and_compare(job: int) -> tuple[int, str]:
    """One job: a sampler and an attention, each of a shape no other job uses (so nothing is cached)."""
    vocab = 512 + 16 * job
    logits = jax.random.normal(jax.random.key(job), (2, vocab))
    key = jax.random.key_data(jax.random.key(1000 + job))
    sampler = _top_k_sampler(3 + job % 5) if job % 2 else _top_p_sampler(0.9)
    fused = jax.jit(sampler, compiler_options=OPTIONS)(logits, key)
    np.testing.assert_array_equal(fused, jax.jit(sampler)(logits, key), err_msg=f"job {job}")
    q = jax.random.normal(jax.random.key(2000 + job), (1, 8 + job, 2, 64))
    out = jax.jit(_attention, compiler_options=OPTIONS)(q, q, q)
    np.testing.assert_allclose(out, jax.jit(_attention)(q, q, q), rtol=1e-5, atol=1e-5, err_msg=f"job {job}")
    return job, "top_k" if job % 2 else "top_p"


def test_threads_compile_samplers_and_attention_through_the_default_pipeline():
    before = pipeline.STATS.copy()
    jobs = range(ROUNDS * THREADS)
    for round_start in range(0, len(jobs), THREADS):
        with ThreadPoolExecutor(max_workers=THREADS) as pool:
            done = list(pool.map(_compile_and_compare, jobs[round_start : round_start + THREADS]))
        assert [job for job, _ in done] == list(jobs[round_start : round_start + THREADS])
    fired = pipeline.STATS - before
    assert sum(n for rule, n in fired.items() if rule.endswith("_to_sample")) == len(jobs), dict(fired)
    assert sum(n for rule, n in fired.items() if rule.endswith("_to_attention")) == len(jobs), dict(fired)
    assert fired["sampling_not_fused"] == 0, dict(fired)
