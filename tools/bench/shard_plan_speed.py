#!/usr/bin/env python3
"""What `multi_device=local` costs a compile: Shardy's propagation on a probe copy of a sharded module.

    python tools/bench/shard_plan_speed.py --layers 8 32 --repeats 3

Lowers an N-layer stack of Megatron-style attention layers (q/k/v projections sharded by heads over
`model`, the batch over `data`, mesh (2, 4) on 8 host devices), fuses it, and times
`hlofuse.partition.plan.plan_shards` on the fused module against the whole pipeline with
`multi_device=keep` and `local`, and against XLA's compile of the plain program (its first compile). Prints medians.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import argparse  # noqa: E402
from collections.abc import Callable  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from hlofuse.passes.lower_kernels import composite_call  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from timing import median_time  # noqa: E402

from hlofuse.ir.context import parse_module  # noqa: E402
from hlofuse.partition.plan import composites_in, plan_shards  # noqa: E402
from hlofuse.pipeline import run_pipeline  # noqa: E402

FUSE = "hlofuse-prepare,hlofuse-fuse-sampling,hlofuse-fuse-attention"


def _layers(count: int) -> Callable[..., jax.Array]:
    def model(x: jax.Array, wq: jax.Array, wk: jax.Array, wv: jax.Array, wo: jax.Array) -> jax.Array:
        for i in range(count):
            q, k, v = (jnp.einsum("bte,enh->btnh", x, w[i]) for w in (wq, wk, wv))
            s = jnp.einsum("btnh,bsnh->bnts", q, k) / np.float32(np.sqrt(q.shape[-1]))
            x = x + jnp.einsum("btnh,nhe->bte", jnp.einsum("bnts,bsnh->btnh", jax.nn.softmax(s, axis=-1), v), wo[i])
        return x

    return model


def measure(layers: int, repeats: int) -> tuple[float, float, float, float]:
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))
    b, t, e, n, h = 4, 64, 256, 8, 32
    args = (jnp.zeros((b, t, e)), *(jnp.zeros((layers, e, n, h)) for _ in range(3)), jnp.zeros((layers, n, h, e)))
    specs = (P("data"), P(None, None, "model"), P(None, None, "model"), P(None, None, "model"), P(None, "model"))
    lowered = jax.jit(_layers(layers), in_shardings=tuple(NamedSharding(mesh, s) for s in specs)).lower(*args)
    text = lowered.as_text()
    fused = parse_module(text)
    run_pipeline(fused, f"builtin.module({FUSE})")
    composites = composites_in(fused.operation)
    calls = [composite_call(c) for c in composites]
    plan = median_time(lambda: plan_shards(fused.operation, composites, calls, "cpu", 8), repeats, warmup=False)
    pipelines = [median_time(lambda mode=mode: run_pipeline(  # type: ignore[misc]
        parse_module(text), f"builtin.module({FUSE},hlofuse-lower-kernels{{target=cpu multi_device={mode}}})"),
        repeats, warmup=False) for mode in ("keep", "local")]
    xla = median_time(lowered.compile, 1, warmup=False)  # once: JAX keeps the executable, a second compile is a lookup
    return plan, pipelines[0], pipelines[1], xla


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print("| layers | plan_shards (s) | pipeline, keep (s) | pipeline, local (s) | XLA compile, plain (s) |")
    print("|---:|---:|---:|---:|---:|")
    for layers in args.layers:
        plan, keep, local, xla = measure(layers, args.repeats)
        print(f"| {layers} | {plan:.3f} | {keep:.3f} | {local:.3f} | {xla:.2f} |", flush=True)


if __name__ == "__main__":
    main()
