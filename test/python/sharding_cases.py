"""Sharded programs compiled with and without hlofuse on 8 host devices; prints one JSON report.

Run by test_sharding.py in a subprocess (the device count must be set before JAX starts, and the
rest of the suite keeps one device): `python test/python/sharding_cases.py [case ...]`.
For each case: whether the fused result equals the unfused one, how many hlofuse kernel calls the
compiled HLO has, and the collectives (all-gather, all-reduce, all-to-all, collective-permute,
reduce-scatter) in each compiled program.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

COLLECTIVES = ("all-gather", "all-reduce", "all-to-all", "collective-permute", "reduce-scatter")
KERNELS = ("hlofuse_attention", "hlofuse_sample", "hlofuse_sample_top_k")
# Kernels in a multi-device module: multi_device=batch lowers every composite; the default pipeline (local)
# lowers those whose sharded dims stay local.
# `--target T --mode M` on the command line lowers for another target (tpu-interpret, neuron-sim, ...).
PIPELINE = ("builtin.module(hlofuse-prepare,hlofuse-fuse-sampling,hlofuse-fuse-attention,"
            "hlofuse-lower-kernels{{target={target} multi_device={mode}}})")
OPTIONS = {"hlofuse_pipeline": PIPELINE.format(target="cpu", mode="batch"), "hlofuse_strict": True}
# The sequence-parallel prefill cases: multi_device=sequence splits every prefill's query and key ranges
# (docs/sharding.md); under --mode local they run with local, which splits where the sequences are sharded.
SEQUENCE_OPTIONS = {"hlofuse_pipeline": PIPELINE.format(target="cpu", mode="sequence"), "hlofuse_strict": True}


def pipeline_counters(module_text: str, pipeline: str) -> dict[str, int]:
    """What hlofuse's passes did to the module (`pipeline`, as the compile hook runs it)."""
    from hlofuse.ir.context import parse_module
    from hlofuse.pipeline import run_pipeline

    module = parse_module(module_text)
    return dict(run_pipeline(module, pipeline).counters)


def attention(q: jax.Array, k: jax.Array, v: jax.Array, causal: bool = False) -> jax.Array:
    """Plain jnp attention, BTNH; GQA through jnp.repeat when k has fewer heads. Causal: query i sits at key
    position i + S - T (the queries are the last T positions, as in a chunk appended to a cache)."""
    groups = q.shape[2] // k.shape[2]
    if groups > 1:
        k, v = jnp.repeat(k, groups, axis=2), jnp.repeat(v, groups, axis=2)
    s = jnp.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(q.shape[-1]).astype(np.float32)
    if causal:
        t, length = q.shape[1], k.shape[1]
        s = jnp.where(jnp.arange(length)[None, :] <= jnp.arange(t)[:, None] + (length - t), s, -jnp.inf)
    return jnp.einsum("bnts,bsnd->btnd", jax.nn.softmax(s, axis=-1), v)


def causal_attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    return attention(q, k, v, causal=True)


def mesh_of(shape: tuple[int, ...], names: tuple[str, ...]) -> jax.sharding.Mesh:
    """A mesh whose axes are Auto: the partitioner (Shardy) propagates and chooses, as in most programs."""
    return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape))


_BYTES = {"f32": 4, "s32": 4, "u32": 4, "bf16": 2, "f16": 2, "pred": 1, "f64": 8, "s64": 8}


def collectives(text: str) -> dict[str, int]:
    """Collective instructions by kind, and `bytes`: the summed size of their results."""
    counts = {name: 0 for name in COLLECTIVES}
    counts["bytes"] = 0
    for line in text.splitlines():
        for name in COLLECTIVES:
            # `%all-gather.3 = f32[8,16]{1,0} all-gather(...)` (or an async `all-reduce-start(`)
            if re.search(rf"\s{name}(?:-start)?\(", line):
                counts[name] += 1
                for dtype, dims in re.findall(r"\b([a-z]+\d*)\[([\d,]*)\]", line.split(f" {name}")[0]):
                    counts["bytes"] += _BYTES.get(dtype, 4) * math.prod(int(d) for d in dims.split(",") if d)
    return counts


def run(fn: Callable[..., Any], args: tuple[Any, ...], in_specs: tuple[Any, ...], out_spec: Any,
        mesh: jax.sharding.Mesh, exact: bool = False, options: dict[str, Any] | None = None) -> dict[str, Any]:
    shardings = tuple(NamedSharding(mesh, s) for s in in_specs)
    placed = tuple(jax.device_put(a, s) for a, s in zip(args, shardings, strict=True))
    jitted = jax.jit(fn, in_shardings=shardings, out_shardings=NamedSharding(mesh, out_spec))
    lowered = jitted.lower(*placed)
    plain = lowered.compile()
    options = options or OPTIONS
    fused = lowered.compile(options)
    default = lowered.compile({"hlofuse_pipeline": "default", "hlofuse_strict": True})
    want = np.asarray(plain(*placed))

    def same(compiled: Any) -> bool:  # noqa: ANN401
        got = np.asarray(compiled(*placed))
        return bool(np.array_equal(want, got) if exact else np.allclose(want, got, rtol=1e-5, atol=1e-5))

    text = fused.as_text()
    return {"equal": same(fused), "kernels": {k: text.count(f'custom_call_target="{k}"') for k in KERNELS},
            "counters": pipeline_counters(lowered.as_text(), options["hlofuse_pipeline"]),
            "fused": collectives(text), "unfused": collectives(plain.as_text()),
            "default_equal": same(default), "default": collectives(default.as_text())}


def _qkv(b: int, t: int, s: int, n: int, kv: int, h: int, seed: int = 0) -> tuple[jax.Array, ...]:
    keys = jax.random.split(jax.random.key(seed), 3)
    return (jax.random.normal(keys[0], (b, t, n, h), jnp.float32),
            jax.random.normal(keys[1], (b, s, kv, h), jnp.float32),
            jax.random.normal(keys[2], (b, s, kv, h), jnp.float32))


def case_data_parallel() -> dict[str, Any]:
    mesh = mesh_of((8,), ("data",))
    spec = P("data")
    return run(attention, _qkv(8, 16, 16, 4, 4, 16), (spec,) * 3, spec, mesh)


def case_data_parallel_2d() -> dict[str, Any]:
    """2-D mesh, batch over both axes; GQA (8 heads on 2 kv heads)."""
    mesh = mesh_of((4, 2), ("data", "fsdp"))
    spec = P(("data", "fsdp"))
    return run(attention, _qkv(8, 8, 32, 8, 2, 16), (spec,) * 3, spec, mesh)


def case_data_parallel_decode() -> dict[str, Any]:
    """Decode (one query against a 64-key cache) with the batch sharded: the kernel's decode path."""
    mesh = mesh_of((8,), ("data",))
    spec = P("data")
    return run(attention, _qkv(8, 1, 64, 4, 2, 16), (spec,) * 3, spec, mesh)


def _megatron(mesh: jax.sharding.Mesh, kv: int, batch_axis: str | None) -> dict[str, Any]:
    b, t, e, n, h = 4, 16, 64, 8, 16

    def layer(x: jax.Array, wq: jax.Array, wk: jax.Array, wv: jax.Array, wo: jax.Array) -> jax.Array:
        q = jnp.einsum("bte,enh->btnh", x, wq)
        k = jnp.einsum("bte,enh->btnh", x, wk)
        v = jnp.einsum("bte,enh->btnh", x, wv)
        return jnp.einsum("btnh,nhe->bte", attention(q, k, v), wo)

    keys = jax.random.split(jax.random.key(1), 5)
    args = (jax.random.normal(keys[0], (b, t, e)), jax.random.normal(keys[1], (e, n, h)) / 8,
            jax.random.normal(keys[2], (e, kv, h)) / 8, jax.random.normal(keys[3], (e, kv, h)) / 8,
            jax.random.normal(keys[4], (n, h, e)) / 8)
    w = P(None, "model")
    return run(layer, args, (P(batch_axis), w, w, w, P("model")), P(batch_axis), mesh)


def case_head_parallel() -> dict[str, Any]:
    """Megatron-style: q/k/v projections sharded by heads over 8 devices, the output projection reduces."""
    return _megatron(mesh_of((8,), ("model",)), kv=8, batch_axis=None)


def case_head_parallel_2d() -> dict[str, Any]:
    """2-D mesh: batch over `data` (2), heads over `model` (4)."""
    return _megatron(mesh_of((2, 4), ("data", "model")), kv=8, batch_axis="data")


def case_gqa_kv_heads_sharded() -> dict[str, Any]:
    """GQA, 8 query heads on 4 kv heads, kv heads sharded over 4 devices (2-D mesh with data=2)."""
    return _megatron(mesh_of((2, 4), ("data", "model")), kv=4, batch_axis="data")


def case_decode_kv_sequence_sharded() -> dict[str, Any]:
    """Decode against a KV cache whose sequence is sharded over 8 devices (flash-decoding's split)."""
    mesh = mesh_of((8,), ("seq",))
    kv_spec = P(None, "seq")
    return run(attention, _qkv(2, 1, 256, 4, 4, 16), (P(), kv_spec, kv_spec), P(), mesh)


def _causal_decode(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """GQA decode of the token at position 200 of a 256-key cache: keys after it are masked (causal with
    q_offset = 200), which each key range turns into its own key length."""
    k, v = (jnp.repeat(x, q.shape[2] // k.shape[2], axis=2) for x in (k, v))
    s = jnp.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(q.shape[-1]).astype(np.float32)
    visible = jnp.arange(k.shape[1])[None, :] <= (jnp.arange(q.shape[1]) + 200)[:, None]
    s = jnp.where(visible[None, None], s, -jnp.inf)
    return jnp.einsum("bnts,bsnd->btnd", jax.nn.softmax(s, axis=-1), v)


def case_decode_kv_sequence_sharded_causal_gqa() -> dict[str, Any]:
    """Causal GQA decode (8 query heads on 2 kv heads) with the cache's sequence sharded over 8 devices."""
    mesh = mesh_of((8,), ("seq",))
    kv_spec = P(None, "seq")
    return run(_causal_decode, _qkv(2, 1, 256, 8, 2, 16), (P(), kv_spec, kv_spec), P(), mesh)


def _cache_attention(q: jax.Array, k: jax.Array, v: jax.Array, lengths: jax.Array) -> jax.Array:
    """Decode against a KV cache filled up to a per-row length (keys >= length masked with -inf)."""
    s = jnp.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(q.shape[-1]).astype(np.float32)
    s = jnp.where(jnp.arange(k.shape[1])[None, None, None, :] < lengths[:, None, None, None], s, -jnp.inf)
    return jnp.einsum("bnts,bsnd->btnd", jax.nn.softmax(s, axis=-1), v)


def case_decode_kv_sequence_sharded_lengths() -> dict[str, Any]:
    """2-D mesh: batch over `data` (2), the cache's sequence over `seq` (4), per-row cache lengths; each
    device holds 2 of the 8 key-range splits, some of them past a row's length (they weigh 0)."""
    mesh = mesh_of((2, 4), ("data", "seq"))
    kv_spec = P("data", "seq")
    lengths = jnp.asarray([200, 37, 256, 1], jnp.int32)
    return run(_cache_attention, (*_qkv(4, 1, 256, 8, 8, 16), lengths), (P("data"), kv_spec, kv_spec, P("data")),
               P("data"), mesh)


def _prefill_kv_sequence_sharded(fn: Callable[..., Any]) -> dict[str, Any]:
    """A 16-query prefill chunk against a 256-key cache sharded along S over 8 devices: T * N * P = 512 <= S * K
    = 1024, so even multi_device=batch splits the key range (P = 8, one per device)."""
    mesh = mesh_of((8,), ("seq",))
    kv_spec = P(None, "seq")
    return run(fn, _qkv(2, 16, 256, 4, 4, 16), (P(), kv_spec, kv_spec), P(), mesh)


def case_prefill_kv_sequence_sharded() -> dict[str, Any]:
    return _prefill_kv_sequence_sharded(attention)


def case_prefill_kv_sequence_sharded_causal() -> dict[str, Any]:
    """The same chunk, causal: query i sees keys up to 240 + i, so the first 7 splits see all their keys and
    the last one a band (its own q_offset, 240 - 7 * 32 = 16)."""
    return _prefill_kv_sequence_sharded(causal_attention)


def case_prefill_kv_sequence_sharded_2d() -> dict[str, Any]:
    """2-D mesh: batch over `data` (2), the cache's sequence over `seq` (4); causal GQA chunk (8 query heads on
    2 kv heads: 16 * 8 * 8 = 1024 <= 512 * 2). Each device holds 2 of the 8 key-range splits."""
    mesh = mesh_of((2, 4), ("data", "seq"))
    kv_spec = P("data", "seq")
    return run(causal_attention, _qkv(4, 16, 512, 8, 2, 16), (P("data"), kv_spec, kv_spec), P("data"), mesh)


def case_prefill_query_sequence_sharded() -> dict[str, Any]:
    """Causal self-attention prefill with the queries sharded along T over 8 devices and K/V whole (as after
    an all-gather of K/V in context parallelism); multi_device=sequence splits the query range (Pt = 8), so
    each device attends its own rows, each with its own causal offset."""
    mesh = mesh_of((8,), ("seq",))
    return run(causal_attention, _qkv(2, 64, 64, 4, 4, 16), (P(None, "seq"), P(), P()), P(None, "seq"), mesh,
               options=SEQUENCE_OPTIONS)


def case_prefill_sequence_parallel() -> dict[str, Any]:
    """Causal self-attention with q, k and v all sharded along the sequence (8 devices), multi_device=sequence:
    the call has both query and key splits; the partitioner keeps one of them sharded and gathers the other
    operands, as the unfused program gathers K and V."""
    mesh = mesh_of((8,), ("seq",))
    spec = P(None, "seq")
    return run(causal_attention, _qkv(2, 64, 64, 4, 4, 16), (spec,) * 3, spec, mesh, options=SEQUENCE_OPTIONS)


def _greedy(logits: jax.Array) -> jax.Array:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)


def _top_k(logits: jax.Array, key: jax.Array) -> jax.Array:
    values, ids = jax.lax.top_k(logits, 8)
    pick = jax.random.categorical(jax.random.wrap_key_data(key), values / 0.7, axis=-1)
    return jnp.take_along_axis(ids, pick[..., None], axis=-1)[..., 0].astype(jnp.int32)


def _logits(rows: int, vocab: int) -> jax.Array:
    return 3 * jax.random.normal(jax.random.key(2), (rows, vocab), jnp.float32)


def case_sampling_batch_sharded() -> dict[str, Any]:
    mesh = mesh_of((8,), ("data",))
    return run(_greedy, (_logits(16, 1024),), (P("data"),), P("data"), mesh, exact=True)


def case_sampling_top_k_batch_sharded() -> dict[str, Any]:
    mesh = mesh_of((8,), ("data",))
    key = jax.random.key_data(jax.random.key(3)).astype(jnp.uint32)
    return run(_top_k, (_logits(16, 1024), key), (P("data"), P()), P("data"), mesh, exact=True)


def case_sampling_temperature_batch_sharded() -> dict[str, Any]:
    """Temperature sampling of (8, 2, V) logits, the first row dim sharded: each shard's rows start at a
    multiple of 2 in the global row order, where its noise counters start."""
    mesh = mesh_of((8,), ("data",))
    logits = _logits(16, 256).reshape(8, 2, 256)
    return run(_temperature, (logits, jax.random.key_data(jax.random.key(3))), (P("data"), P()), P("data"), mesh,
               exact=True)


def case_sampling_vocab_sharded() -> dict[str, Any]:
    mesh = mesh_of((8,), ("vocab",))
    return run(_greedy, (_logits(4, 1024),), (P(None, "vocab"),), P(), mesh, exact=True)


def _temperature(logits: jax.Array, key: jax.Array) -> jax.Array:
    return jax.random.categorical(jax.random.wrap_key_data(key), logits / 0.7, axis=-1).astype(jnp.int32)


def _top_k_mask(logits: jax.Array, key: jax.Array) -> jax.Array:
    """MaxText style: logits below the 8th largest become -inf, then / T."""
    kth = jax.lax.top_k(logits, 8)[0][..., -1:]
    masked = jnp.where(logits < kth, -jnp.inf, logits)
    return jax.random.categorical(jax.random.wrap_key_data(key), masked / 0.7, axis=-1).astype(jnp.int32)


def _vocab_sharded(fn: Callable[..., Any]) -> dict[str, Any]:
    """A stochastic sampler over logits whose vocabulary is sharded over 8 devices."""
    mesh = mesh_of((8,), ("vocab",))
    key = jax.random.key_data(jax.random.key(3)).astype(jnp.uint32)
    return run(fn, (_logits(4, 1024), key), (P(None, "vocab"), P()), P(), mesh, exact=True)


def case_sampling_temperature_vocab_sharded() -> dict[str, Any]:
    return _vocab_sharded(_temperature)


def case_sampling_top_k_vocab_sharded() -> dict[str, Any]:
    return _vocab_sharded(_top_k)


def case_sampling_top_k_mask_vocab_sharded() -> dict[str, Any]:
    return _vocab_sharded(_top_k_mask)


def _min_p(logits: jax.Array, key: jax.Array) -> jax.Array:
    """min-p as the sampler libraries write it: temperature, softmax, keep >= min_p * the largest."""
    scaled = logits / 0.8
    probs = jax.nn.softmax(scaled, axis=-1)
    keep = probs >= 0.05 * jnp.max(probs, axis=-1, keepdims=True)
    masked = jnp.where(keep, scaled, -jnp.inf)
    return jax.random.categorical(jax.random.wrap_key_data(key), masked, axis=-1).astype(jnp.int32)


def case_sampling_min_p_vocab_sharded() -> dict[str, Any]:
    return _vocab_sharded(_min_p)


def _top_p(logits: jax.Array, key: jax.Array) -> jax.Array:
    """JetStream's nucleus: sort, softmax, cumsum, cut at p, then / T."""
    ordered = jnp.sort(logits, axis=-1)[..., ::-1]
    cumulative = jnp.cumsum(jax.nn.softmax(ordered, axis=-1), axis=-1)
    cutoff = jnp.take_along_axis(ordered, jnp.sum(cumulative < 0.9, axis=-1, keepdims=True), axis=-1)
    masked = jnp.where(logits < cutoff, -jnp.inf, logits)
    return jax.random.categorical(jax.random.wrap_key_data(key), masked / 0.7, axis=-1).astype(jnp.int32)


def case_sampling_top_p_vocab_sharded() -> dict[str, Any]:
    """Whole rows: the nucleus needs the sorted row, which the unfused program gathers as well."""
    return _vocab_sharded(_top_p)


def case_sampling_vocab_sharded_2d() -> dict[str, Any]:
    """Rows over `data` (2) and the vocabulary over `model` (4): each device holds 2 of the 8 splits of its
    rows."""
    mesh = mesh_of((2, 4), ("data", "model"))
    key = jax.random.key_data(jax.random.key(4)).astype(jnp.uint32)
    return run(_temperature, (_logits(8, 1024), key), (P("data", "model"), P()), P("data"), mesh, exact=True)


def case_shard_map() -> dict[str, Any]:
    """Attention and greedy sampling inside a shard_map body (batch over `data`, heads over `model`)."""
    mesh = mesh_of((2, 4), ("data", "model"))
    spec = P("data", None, "model")

    def body(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        out = attention(q, k, v)
        return _greedy(out.reshape(out.shape[0], -1))[:, None, None]

    def f(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return jax.shard_map(body, mesh=mesh, in_specs=(spec,) * 3, out_specs=P("data", None, "model"))(q, k, v)

    return run(f, _qkv(4, 8, 16, 8, 8, 16), (spec,) * 3, P("data", None, "model"), mesh, exact=True)


CASES: dict[str, Callable[[], dict[str, Any]]] = {
    name.removeprefix("case_"): fn for name, fn in globals().items() if name.startswith("case_")
}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", help=f"cases to run (default: all of {', '.join(CASES)})")
    parser.add_argument("--target", default="cpu", help="hlofuse-lower-kernels target (default: cpu)")
    parser.add_argument("--mode", default="batch", choices=("batch", "local"),
                        help="multi_device (default: batch; the sequence-parallel cases take sequence then)")
    args = parser.parse_args(argv)
    OPTIONS["hlofuse_pipeline"] = PIPELINE.format(target=args.target, mode=args.mode)
    SEQUENCE_OPTIONS["hlofuse_pipeline"] = PIPELINE.format(target=args.target,
                                                           mode="sequence" if args.mode == "batch" else args.mode)
    names = args.cases or list(CASES)
    report: dict[str, Any] = {}
    for name in names:
        try:
            report[name] = CASES[name]()
        except Exception as error:  # noqa: BLE001 - reported per case, the test says which failed
            report[name] = {"error": f"{type(error).__name__}: {error}"[:2000]}
    print(json.dumps(report))


if __name__ == "__main__":
    assert len(jax.devices()) == 8, jax.devices()
    main(sys.argv[1:])
