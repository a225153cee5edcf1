#!/usr/bin/env python3
"""What a filter stage's sorts cost on the CPU kernel (docs/kernels-cpu-sampling.md, "Filters in front of the form:
stages"): each way `on_kernel_sorts` runs a sort or a top-k of a (B, V) row, beside XLA's argmax of the same row.

    python tools/bench/stage_sorts.py                               # 1 x 128256
    python tools/bench/stage_sorts.py --batch 8 --vocab 262144 --kept 50

Rows: the kernel's stable sort of a full row and of a row a top-k left (`--kept` tokens, -inf elsewhere: its fill
placed by one pass, the others radix-sorted), the stable order of int32 keys that are a permutation (an argsort's
argsort: inverted by one scatter), lax.top_k by the kernel's selection at several k, and the row sorted in
lax.top_k's order (what a top-k larger than `TOP_K_BY_SELECTION_UP_TO` takes). Times are medians of --iters
interleaved calls in milliseconds; on 2 shared cores read the ratios to argmax.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from hlofuse.kernels.cpu import sampling  # noqa: E402


def _cases(batch: int, vocab: int, kept: int, top_ks: list[int]) -> dict[str, tuple[Callable[..., Any], jax.Array]]:
    x = jax.random.normal(jax.random.key(0), (batch, vocab)) * 3
    filtered = jnp.where(x >= jax.lax.top_k(x, kept)[0][:, -1:], x, -jnp.inf)
    permutation = jnp.argsort(x, axis=-1).astype(jnp.int32)
    cases: dict[str, tuple[Callable[..., Any], jax.Array]] = {
        "sort, full row": (sampling._sort_by_kernel, x),
        f"sort, {kept} kept": (sampling._sort_by_kernel, filtered),
        "int32 order, a permutation": (sampling._stable_order_by_kernel, permutation),
        "sort in lax.top_k's order": (lambda y: sampling._sorted_by(sampling.SORT_DESCENDING_TARGET, y), x),
    }
    for k in top_ks:
        cases[f"top-k {k} by selection"] = (lambda y, k=k: sampling._top_k_by_kernel(y, k), x)
    cases["argmax (XLA)"] = (lambda y: jnp.argmax(y, axis=-1), x)
    return {name: (jax.jit(fn), arg) for name, (fn, arg) in cases.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--kept", type=int, default=40, help="the tokens a top-k left in the filtered row")
    parser.add_argument("--top-k", type=int, nargs="+", default=[64, 1024, 4096, 16384])
    parser.add_argument("--iters", type=int, default=15)
    args = parser.parse_args()
    if not sampling.is_available():
        raise SystemExit("the native CPU sampling kernel is not built (pip install . builds it)")

    cases = _cases(args.batch, args.vocab, args.kept, args.top_k)
    for fn, arg in cases.values():
        jax.block_until_ready(fn(arg))
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.iters):
        for name, (fn, arg) in cases.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(arg))
            times[name].append(time.perf_counter() - start)
    argmax = statistics.median(times["argmax (XLA)"])
    print(f"{args.batch} x {args.vocab}, medians of {args.iters} interleaved calls")
    print("| what | ms | / argmax |")
    print("|---|---:|---:|")
    for name, taken in times.items():
        median = statistics.median(taken)
        print(f"| {name} | {median * 1e3:.3f} | {median / argmax:.2f}x |")


if __name__ == "__main__":
    main()
