#!/usr/bin/env python3
"""CPU token sampling: hlofuse's kernel vs the original XLA program vs plain argmax, in one run.

    python tools/bench/sampling_cpu.py                              # every mode, batch 1..64, vocab 32k..256k
    python tools/bench/sampling_cpu.py --batch 8 --vocab 128256     # the headline row

Times are medians of --iters runs after a warm-up, in milliseconds, for (batch, vocab) logits in f32 and
bf16. "original" is the sampler form as JAX programs write it (sort-based for top-p; the "(argsort)"
modes take their top-k by a stable argsort sliced to k, another writing the fusion matches), compiled by XLA;
"argmax" is `jnp.argmax(x, -1)` and "read" `jnp.max(x, -1)` (one pass over the logits), both XLA. Before
timing, every mode's token ids are checked equal to the original's (same key).
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from hlofuse.kernels.cpu import sampling
from hlofuse.kernels.sampling_reference import FORMS, sample_reference, top_k_by_argsort

# mode: (form, parameters, the top-k writing of the original program: None for lax.top_k)
MODES = {"greedy": ("greedy", {}, None), "greedy (softmax)": ("greedy_softmax", {}, None),
         "temperature": ("temperature", {"temperature": 0.7}, None),
         "top-k": ("top_k", {"temperature": 0.7, "k": 50}, None),
         "top-k (argsort)": ("top_k", {"temperature": 0.7, "k": 50}, top_k_by_argsort),
         "top-k mask (argsort)": ("top_k_mask", {"temperature": 0.7, "k": 50}, top_k_by_argsort),
         "top-p": ("top_p_mask", {"temperature": 0.7, "p": 0.9}, None),
         "top-k+top-p": ("top_k_top_p_mask", {"temperature": 0.7, "k": 50, "p": 0.9}, None),
         "min-p": ("min_p", {"temperature": 0.7, "min_p": 0.05}, None)}


def _original(form: str, params: dict[str, float], top_k_fn: object) -> object:
    if top_k_fn is None:
        return jax.jit(lambda x, k: sample_reference(x, k, form=form, **params))
    return jax.jit(lambda x, k: FORMS[form].fn(x, k, **params, top_k_fn=top_k_fn).astype(jnp.int32))


def _time(fn: object, *args: jax.Array, iters: int) -> float:
    jax.block_until_ready(fn(*args))  # type: ignore[operator]
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, nargs="*", default=[1, 8, 64])
    parser.add_argument("--vocab", type=int, nargs="*", default=[32000, 128256, 256000])
    parser.add_argument("--dtype", nargs="*", default=["float32", "bfloat16"])
    parser.add_argument("--modes", nargs="*", default=list(MODES))
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args()
    print("| mode | dtype | batch | vocab | original ms | hlofuse ms | argmax ms | read ms | speed-up | vs argmax "
          "| vs read |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    key = jnp.array([0, 42], jnp.uint32)
    for dtype in args.dtype:
        for batch in args.batch:
            for vocab in args.vocab:
                x = jnp.asarray(np.random.default_rng(0).standard_normal((batch, vocab)) * 3, dtype)
                argmax_ms = _time(jax.jit(lambda x: jnp.argmax(x, -1)), x, iters=args.iters)
                read_ms = _time(jax.jit(lambda x: jnp.max(x, -1)), x, iters=args.iters)
                for mode in args.modes:
                    form, params, top_k_fn = MODES[mode]
                    if dtype == "bfloat16" and form in sampling.BF16_UNSUPPORTED:
                        continue
                    orig = _original(form, params, top_k_fn)
                    ours = jax.jit(lambda x, k, f=form, p=params: sampling.sample(x, k, form=f, **p))
                    assert (np.asarray(orig(x, key)) == np.asarray(ours(x, key))).all(), (mode, dtype, batch, vocab)
                    o, h = _time(orig, x, key, iters=args.iters), _time(ours, x, key, iters=args.iters)
                    print(f"| {mode} | {dtype} | {batch} | {vocab} | {o:.3f} | {h:.3f} | {argmax_ms:.3f} | "
                          f"{read_ms:.3f} | {o / h:.1f}x | {h / argmax_ms:.2f}x | {h / read_ms:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
