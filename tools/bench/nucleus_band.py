#!/usr/bin/env python3
"""How often a certified nucleus draw falls in its band on the CPU, so that the program's own cut decides the batch.

The kernel draws a sorted nucleus among the tokens at or above the band of values that the program's f32 rounding
could move the cut across, and vouches only for a winner above it (docs/kernels-cpu-sampling.md, "Certified nucleus
cut"). This prints, per family (a cut by value from the top as JetStream writes it; Hugging Face's cut from the
bottom, with a categorical draw and with torch.multinomial's; Flax's exclusive cut), the share of draws left
UNCERTIFIED over `--keys` keys of `--rows` rows of `scale * N(0, 1)` logits, for each p:

    python tools/bench/nucleus_band.py                         # 64 x 128256, scales 3 and 6, p 0.5 0.9 0.95
    python tools/bench/nucleus_band.py --vocab 262144 --scale 6 --p 0.9

With --time it times instead, for each draw, the kernel's one call (band, scaling and draw: `nucleus_draw_by_band`)
against the band's own call followed by the draw over XLA's masked row (`nucleus_band`, then `draw_in_band`),
interleaved in one process, with XLA's argmax beside them; both give the same ids where both vouch:

    python tools/bench/nucleus_band.py --time --rows 1 8 --vocab 128256 --scale 3 --p 0.9

A share of s costs s times the program's cut (the kernel's radix sort and XLA's softmax and cumsum) per row, but
the cut runs for the whole batch when any row needs it: 1 - (1 - s)^B of the calls at batch B.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from hlofuse.kernels.cpu import sampling  # noqa: E402
from hlofuse.kernels.sampling_reference import UNCERTIFIED  # noqa: E402


def _families(temperature: float) -> dict[str, object]:
    """name -> (x, key, p) -> tokens, UNCERTIFIED rows as they are."""

    def kernel_form(form: str) -> object:
        def draw(x: jax.Array, key: jax.Array, p: float) -> jax.Array:
            rows = x.shape[0]
            return sampling._sample_call(x, jnp.broadcast_to(key, (rows, 2)), jax.lax.iota(jnp.int32, rows), form=form,
                                         temperature=temperature, k=0, p=p, min_p=0.0)[0]

        return draw

    def by_band(draw: str, from_below: bool) -> object:
        return lambda x, key, p: sampling.nucleus_draw_by_band(draw, x, key, p, temperature, from_below=from_below,
                                                               by_place=True)

    return {"value cut from the top (top_p_mask)": kernel_form("top_p_mask"),
            "Hugging Face, categorical": kernel_form("top_p_mask_from_below"),
            "Hugging Face, torch.multinomial": by_band("choice", True),
            "Flax (exclusive, from the top)": by_band("", False)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[64], help="the batch (--time: each in turn)")
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--scale", type=float, nargs="+", default=[3.0, 6.0],
                        help="the logits' spread (3: hundreds kept at p = 0.9; 6: a few, as a model's rows)")
    parser.add_argument("--p", type=float, nargs="+", default=[0.5, 0.9, 0.95])
    parser.add_argument("--keys", type=int, default=8)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--time", action="store_true", help="time the one-call draw against the band then the draw")
    parser.add_argument("--iters", type=int, default=40, help="--time: interleaved calls per median")
    args = parser.parse_args()
    if not sampling.is_available():
        raise SystemExit("nucleus_band: the native CPU sampler is not built (pip install . builds it)")
    if args.time:
        _time(args)
        return
    if len(args.rows) != 1:
        parser.error("one --rows without --time")
    (rows,) = args.rows
    print(f"| family | scale | p | draws in the band (of {args.keys} x {rows} at V = {args.vocab}) |")
    print("|---|---:|---:|---:|")
    for scale in args.scale:
        x = jnp.asarray(np.random.default_rng(0).standard_normal((rows, args.vocab)).astype(np.float32) * scale)
        for name, draw in _families(args.temperature).items():
            for p in args.p:
                fn = jax.jit(lambda x, key, draw=draw, p=p: draw(x, key, p))
                left = sum(int(jnp.sum(fn(x, jnp.array([0, seed], jnp.uint32)) == UNCERTIFIED))
                           for seed in range(args.keys))
                print(f"| {name} | {scale:g} | {p:g} | {left / (args.keys * rows):.2%} |", flush=True)


# (draw, from_below): JetStream's cut by value from the top under keras' log-softmax, Hugging Face's by place from the
# bottom under torch.multinomial's choice and under a categorical.
TIMED_DRAWS = (("log_softmax", False), ("choice", True), ("", True))


def _time(args: argparse.Namespace) -> None:
    """Medians of the one-call draw, the band then the draw, and XLA's argmax, interleaved."""
    t = args.temperature
    print("| draw | cut | B | V | p | one call ms | band, then draw ms | argmax ms | one / two | one / argmax |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for rows in args.rows:
        for scale in args.scale:
            x = jnp.asarray(np.random.default_rng(0).standard_normal((rows, args.vocab)).astype(np.float32) * scale)
            key = jnp.array([0, 1], jnp.uint32)
            for draw, below in TIMED_DRAWS:
                for p in args.p:
                    def two_calls(x: jax.Array, key: jax.Array, draw: str = draw, below: bool = below,
                                  p: float = p) -> jax.Array:
                        lo, hi = sampling.nucleus_band(x, p, below, below)
                        return sampling.draw_in_band(draw, x, key, lo, hi, t)

                    fns = {"one": jax.jit(lambda x, key, draw=draw, below=below, p=p: sampling.nucleus_draw_by_band(
                               draw, x, key, p, t, from_below=below, by_place=below)),
                           "two": jax.jit(two_calls),
                           "argmax": jax.jit(lambda x, key: jnp.argmax(x, -1).astype(jnp.int32))}
                    one, two = (np.asarray(fns[n](x, key)) for n in ("one", "two"))
                    both = (one != UNCERTIFIED) & (two != UNCERTIFIED)
                    if not np.array_equal(one[both], two[both]):
                        raise SystemExit(f"{draw or 'categorical'}: the one call and the two disagree")
                    times: dict[str, list[float]] = {n: [] for n in fns}
                    for _ in range(args.iters):
                        for n, f in fns.items():
                            start = time.perf_counter()
                            jax.block_until_ready(f(x, key))
                            times[n].append(time.perf_counter() - start)
                    ms = {n: float(np.median(v)) * 1e3 for n, v in times.items()}
                    cut = "from below, by place" if below else "from the top, by value"
                    print(f"| {draw or 'categorical'} | {cut} | {rows} | {args.vocab} | {p:g} | {ms['one']:.3f} | "
                          f"{ms['two']:.3f} | {ms['argmax']:.3f} | {ms['one'] / ms['two']:.2f}x | "
                          f"{ms['one'] / ms['argmax']:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
