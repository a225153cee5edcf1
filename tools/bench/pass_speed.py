#!/usr/bin/env python3
"""Pass speed: the default pipeline's time on a large module against XLA's CPU compile of it.

    python tools/bench/pass_speed.py --layers 8 32 --repeats 3

Lowers an N-layer Llama-style model (hlofuse.demo's), runs `default` (prepare + fuse-attention) on
clones of the module, and compiles the same module with XLA for the CPU. Prints medians, the op count,
and the ratio pass / XLA, per model size, so growth with module size can be read off.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
from jaxlib.mlir import ir

from hlofuse.demo import init_params, model
from hlofuse.ir.context import clone_module
from hlofuse.pipeline import run_pipeline


def count_ops(module: ir.Module) -> int:
    total = 0

    def visit(op: ir.Operation) -> ir.WalkResult:
        nonlocal total
        total += 1
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return total


def measure(layers: int, repeats: int) -> tuple[int, float, float, int]:
    heads, kv_heads, dim = 8, 2, 256
    params = init_params(jax.random.key(0), layers, dim, heads, kv_heads, dim // heads)
    x = jnp.zeros((1, 128, dim), jnp.float32)
    lowered = jax.jit(lambda p, y: model(p, y, heads=heads, kv_heads=kv_heads)).lower(params, x)
    module = lowered.compiler_ir("stablehlo")
    pass_times, fused = [], 0
    for _ in range(repeats):
        clone = clone_module(module)
        start = time.perf_counter()
        result = run_pipeline(clone, "default")
        pass_times.append(time.perf_counter() - start)
        fused = result.counters["softmax_of_qk_to_attention"]
    xla_times = []
    for _ in range(repeats):
        start = time.perf_counter()
        lowered.compile()
        xla_times.append(time.perf_counter() - start)
        jax.clear_caches()
    return count_ops(module), statistics.median(pass_times), statistics.median(xla_times), fused


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print("| layers | ops | fused | pipeline (s) | XLA CPU compile (s) | ratio |")
    print("|---:|---:|---:|---:|---:|---:|")
    for layers in args.layers:
        ops, pass_s, xla_s, fused = measure(layers, args.repeats)
        print(f"| {layers} | {ops} | {fused} | {pass_s:.3f} | {xla_s:.2f} | {pass_s / xla_s:.3f} |", flush=True)


if __name__ == "__main__":
    main()
