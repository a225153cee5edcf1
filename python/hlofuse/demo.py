"""The main job: jit a small transformer block with and without hlofuse and compare.

    python -m hlofuse.demo [--layers 2] [--seq 128] [--heads 8] [--kv-heads 2] [--head-dim 64]

Prints what hlofuse fused (per rule), that the outputs agree, and the compiled programs' run times.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np

import hlofuse
from hlofuse import pipeline


def transformer_block(params: dict[str, jax.Array], x: jax.Array, *, heads: int, kv_heads: int) -> jax.Array:
    """Pre-norm decoder block: causal GQA self-attention and a gated MLP, as in Llama."""
    b, t, d = x.shape
    head_dim = params["wq"].shape[1] // heads

    def rms_norm(y: jax.Array) -> jax.Array:
        return y * jax.lax.rsqrt(jnp.mean(y * y, axis=-1, keepdims=True) + 1e-6)

    h = rms_norm(x)
    q = (h @ params["wq"]).reshape(b, t, heads, head_dim)
    k = (h @ params["wk"]).reshape(b, t, kv_heads, head_dim)
    v = (h @ params["wv"]).reshape(b, t, kv_heads, head_dim)
    attn = jax.nn.dot_product_attention(q, k, v, is_causal=True).reshape(b, t, heads * head_dim)
    x = x + attn @ params["wo"]
    h = rms_norm(x)
    return x + (jax.nn.silu(h @ params["w1"]) * (h @ params["w3"])) @ params["w2"]


def model(params: list[dict[str, jax.Array]], x: jax.Array, *, heads: int, kv_heads: int) -> jax.Array:
    for layer in params:
        x = transformer_block(layer, x, heads=heads, kv_heads=kv_heads)
    return x


def init_params(key: jax.Array, layers: int, dim: int, heads: int, kv_heads: int,
                head_dim: int) -> list[dict[str, jax.Array]]:
    shapes = {"wq": (dim, heads * head_dim), "wk": (dim, kv_heads * head_dim), "wv": (dim, kv_heads * head_dim),
              "wo": (heads * head_dim, dim), "w1": (dim, 4 * dim), "w3": (dim, 4 * dim), "w2": (4 * dim, dim)}
    params = []
    for _ in range(layers):
        layer = {}
        for name, shape in shapes.items():
            key, sub = jax.random.split(key)
            layer[name] = jax.random.normal(sub, shape, jnp.float32) / np.sqrt(shape[0])
        params.append(layer)
    return params


def _median_ms(fn: object, *args: object, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))  # type: ignore[operator]
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hlofuse.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per program (median reported)")
    parser.add_argument("--pipeline", default="default", help="hlofuse pipeline (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.dim % args.heads or args.heads % args.kv_heads:
        parser.error("--dim must be a multiple of --heads, and --heads of --kv-heads")

    head_dim = args.dim // args.heads
    params = init_params(jax.random.key(0), args.layers, args.dim, args.heads, args.kv_heads, head_dim)
    x = jax.random.normal(jax.random.key(1), (args.batch, args.seq, args.dim), jnp.float32)

    def forward(p: list[dict[str, jax.Array]], y: jax.Array) -> jax.Array:
        return model(p, y, heads=args.heads, kv_heads=args.kv_heads)

    print(f"hlofuse {hlofuse.__version__} on jax {jax.__version__} ({jax.default_backend()}): "
          f"{args.layers} layers, B={args.batch} T={args.seq} D={args.dim} heads={args.heads}/{args.kv_heads}")
    plain = jax.jit(forward)
    before = pipeline.STATS.copy()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback would mean hlofuse did nothing: say so loudly
        fused = jax.jit(forward, compiler_options={"hlofuse_pipeline": args.pipeline})
        fused_out = fused(params, x)
    counts = pipeline.STATS - before
    expected = plain(params, x)

    print("fused:", ", ".join(f"{rule} x{n}" for rule, n in sorted(counts.items())) or "nothing")
    error = float(jnp.max(jnp.abs(fused_out - expected)) / (jnp.max(jnp.abs(expected)) + 1e-30))
    agree = bool(np.allclose(np.asarray(fused_out), np.asarray(expected), rtol=1e-5, atol=1e-5))
    print(f"outputs agree: {'yes' if agree else 'NO'} (max relative difference {error:.2e})")
    plain_ms = _median_ms(plain, params, x, repeats=args.repeats)
    fused_ms = _median_ms(fused, params, x, repeats=args.repeats)
    print(f"median time: plain {plain_ms:.2f} ms, hlofuse {fused_ms:.2f} ms (ratio {fused_ms / plain_ms:.2f})")
    if counts.get("softmax_of_qk_to_attention", 0) != args.layers:
        print(f"expected {args.layers} fused attention sites", file=sys.stderr)
        return 1
    return 0 if agree else 1


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(main())
