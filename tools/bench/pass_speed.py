#!/usr/bin/env python3
"""Pass speed: the default pipeline's time on a large module against XLA's CPU compile of it.

    python tools/bench/pass_speed.py --layers 8 32 --repeats 3

Lowers the prefill of an N-layer Llama-style model (hlofuse.demo's), runs `default` without a target
(prepare, fuse-sampling, fuse-attention) on clones of the module, and compiles the same module with XLA for the CPU.
Prints medians, the op count, and the ratio pass / XLA per model size, so growth can be read off.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
from jax._src import compiler
from jax._src.lib import xla_client
from jaxlib.mlir import ir

from hlofuse.demo import Config, Sampler, init_params, prefill
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


def _xla_compile_seconds(module: ir.Module) -> float:
    """XLA's CPU compile of `module`, straight through the client: no JAX cache in between."""
    client = jax.devices("cpu")[0].client
    device = client.local_devices()[0]
    options = compiler.get_compile_options(num_replicas=1, num_partitions=1, backend=client)
    text = module.operation.get_asm(binary=True)
    start = time.perf_counter()
    client.compile_and_load(text, executable_devices=xla_client.DeviceList((device,)), compile_options=options)
    return time.perf_counter() - start


def measure(layers: int, repeats: int) -> tuple[int, float, float, int]:
    cfg = Config(layers=layers, d_model=256, heads=8, kv_heads=2, head_dim=32, vocab=1024, cache_len=256,
                 dtype=jnp.float32)
    params = init_params(jax.random.key(0), cfg)
    prompt = jnp.zeros((1, 128), jnp.int32)
    key = jax.random.key_data(jax.random.key(0))
    lowered = jax.jit(lambda p, t, k: prefill(p, t, k, cfg, Sampler())).lower(params, prompt, key)
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
        xla_times.append(_xla_compile_seconds(module))
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
