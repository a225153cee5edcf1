"""Per-shard kernel calls for targets XLA cannot partition: Pallas and NKI kernels under `sdy.manual_computation`.

XLA's batch partitioner keeps hlofuse's CPU FFI calls local (hlofuse.sharding). A Pallas (Mosaic TPU,
Triton, Mosaic GPU) or NKI call has no partitioner, and its kernel is compiled for one fixed shape, so
the partitioner would all-gather its operands and run the whole problem on every device. In a
multi-device module `hlofuse-lower-kernels` (multi_device=local or batch) writes instead what a user writes by
hand with `jax.shard_map`: a `sdy.manual_computation` whose body calls the kernel lowered for one
shard's shapes.

Which dims to cut, and over which mesh axes, comes from Shardy itself. `plan_shards` copies the module,
replaces each composite by a probe custom call whose sharding rule (`Cuts`) shares the dims a per-shard
kernel can cut and keeps the others whole, and runs Shardy's propagation on the copy. The probe's
propagated result sharding names the mesh axes of each cut dim, and the manual computation takes
exactly those: XLA's own propagation later meets the same shardings at its boundary.

    %0 = stablehlo.composite "hlofuse.attention" %q, %k, %v {...}   q (4,16,8,16): batch over data, heads over model
  becomes
    %0 = sdy.manual_computation(%q, %k, %v) in_shardings=[<@mesh, [{"data"}, {}, {"model"}, {}]>, ...]
           out_shardings=[<@mesh, [{"data"}, {}, {"model"}, {}]>] manual_axes={"data", "model"}
           (%lq: tensor<2x16x2x16xf32>, %lk: ..., %lv: ...) {
      %1 = func.call @hlofuse.attention.tpu(%lq, %lk, %lv)
      sdy.return %1
    }

What a shard can cut:
- attention: the batch B and the query heads N (with the kv heads K they read: a shard count that
  divides K, or K = 1, whose one kv head every shard keeps). Query head n reads kv head n // (N / K),
  and a shard of N / s query heads reads K / s kv heads, so every shard keeps the head mapping.
- sampling: the first row dim longer than 1 (the rows of a shard are then contiguous). A sampler that
  draws noise gets one more operand (`sampled_rows`), each shard's first global row index (a sharded
  iota), which the kernel adds to its row numbers (`takes_row_offset`): the noise counters are the global
  ones, so each shard draws exactly the ids the whole batch would give its rows. A kernel without that
  option keeps its rows whole when they would be cut. A vocabulary, for the kernels whose spec has a
  `vocab_split` (hlofuse.vocab_splits).
- a decode's key sequence, for the kernels whose spec has a `key_split` (Pallas, NKI): `decode_key_split` gives each
  shard one key range and merges the ranges' partial results (output and log-sum-exp) after the
  manual computation, as flash-decoding merges its splits.
- a prefill's key sequence (a query chunk against a sharded cache), for the Pallas tpu / gpu kernels:
  `prefill_key_split` gives each range its key lengths and its own q_offset (the composite's minus the
  range's start, a traced operand the kernels read per batch row), and merges as above.
- a prefill's query sequence (context parallelism, K and V whole), for the same kernels:
  `prefill_query_split` gives each query range its q_offset (the composite's plus the range's start) and
  its q_lengths; the merge is a reshape. A call cuts its key or its query sequence, not both.

Dims that arrive sharded but that a shard keeps whole (a vocabulary, a sequence no split takes) are named by
`ShardPlan.gathered`: under multi_device=local (the default) the composite then stays, under batch they
are all-gathered at the boundary, as for the CPU batch partitioner.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
from jaxlib.mlir import ir, passmanager
from jaxlib.mlir.dialects import func, sdy, stablehlo

from hlofuse.kernels import CompositeCall, KernelSpec, Lowered, spec_for
from hlofuse.kernels.reference import UNBOUNDED, combine_partials
from hlofuse.ops.attention import AttentionAttrs
from hlofuse.sharding import _dims, _Factors, _rule, module_meshes

PROBE_TARGET = "hlofuse_shard_probe"
PROPAGATION = "builtin.module(sdy-propagation-pipeline)"
SHARDING_ATTR = "sdy.sharding"


@dataclass(frozen=True)
class Cuts:
    """The dims of a composite's operands and results that a per-shard kernel can cut, as one factor
    label per dim ("" keeps the dim whole). A labelled dim larger than its factor (`sizes`) is the
    compound (factor, rest), the rest kept whole: GQA's query heads N = (K, N / K)."""

    operands: tuple[tuple[str, ...], ...]
    results: tuple[tuple[str, ...], ...]
    sizes: dict[str, int]
    exclusive: tuple[str, ...] = ()  # labels of which a shard cuts one, the first that arrives sharded


def attention_cuts(call: CompositeCall) -> Cuts:
    """B and the heads of an `hlofuse.attention` composite (docs/composites.md: q (B,T,N,H), k / v
    (B,S,K,H|D), bias / mask (B|1,N|1,T|1,S|1), lengths (B,); out (B,T,N,D))."""
    roles = list(call.attributes["operands"])
    (q_shape, _), (k_shape, _) = call.operand_types[:2]
    batch, heads, kv_heads = q_shape[0], q_shape[2], k_shape[2]
    kv_label = "n" if kv_heads > 1 else ""  # MQA: the one kv head stays whole on every shard
    labels = {"q": ("b", "", "n", ""), "k": ("b", "", kv_label, ""), "v": ("b", "", kv_label, ""),
              "q_lengths": ("b",), "kv_lengths": ("b",)}
    operands = []
    for role, (shape, _) in zip(roles, call.operand_types, strict=True):
        if role in ("bias", "mask"):
            operands.append(("b" if shape[0] == batch else "", "n" if shape[1] == heads else "", "", ""))
        else:
            operands.append(labels[role])
    return Cuts(tuple(operands), (("b", "", "n", ""),), {"b": batch, "n": kv_heads if kv_heads > 1 else heads})


def sample_cuts(call: CompositeCall, vocab: bool = False) -> Cuts:
    """The first row dim longer than 1 of an `hlofuse.sample` composite (logits (*R, V), key (2,);
    ids (*R,)), if any, and the vocabulary when `vocab` (the CPU kernel's vocabulary splits)."""
    (shape, _), *rest = call.operand_types
    rows = list(shape[:-1])
    first = next((i for i, size in enumerate(rows) if size > 1), None)
    labels = tuple("r" if i == first else "" for i in range(len(rows)))
    sizes = {"r": rows[first]} if first is not None else {}
    if vocab:
        sizes["v"] = shape[-1]
    return Cuts(((*labels, "v" if vocab else ""), *(("",) * len(s) for s, _ in rest)), (labels,), sizes)


# Cuts of the calls that run per shard (every target but the CPU and the reference).
PER_SHARD_CUTS: dict[str, Callable[[CompositeCall], Cuts]] = {
    "hlofuse.attention": attention_cuts,
    "hlofuse.sample": sample_cuts,
}
@dataclass(frozen=True)
class RangeSplit:
    """A composite with a sharded dim that a per-shard kernel cannot take whole (a key or query sequence, a
    vocabulary): `prepare` (JAX, on the whole operands) cuts it into one range per shard, `shard` runs one
    range's kernel under the manual computation (operands and results labelled `operands`, `results`; "s",
    "t" or "v" the range dim) and returns partial results, and `merge` (JAX, after it) combines the ranges
    into the composite's results."""

    prepare: Callable[..., Any]
    shard: Callable[..., Any]
    merge: Callable[..., Any]
    operands: tuple[tuple[str, ...], ...]
    results: tuple[tuple[str, ...], ...]
    # A first pass over the ranges, for a split that needs a row-wide value before its main pass (the k-th
    # largest logit of top_k_mask): `first` runs per shard on the prepared operands, `between` (JAX, on the
    # whole values) takes the prepared operands and the first pass's results and gives `shard`'s operands.
    first: ShardPass | None = None
    between: Callable[..., Any] | None = None
    platforms: tuple[str, ...] = ()  # what `shard` is lowered for (a kernel's platform); empty: this host

    def __post_init__(self) -> None:
        if (self.first is None) != (self.between is None):
            raise ValueError("a RangeSplit takes a first pass and its `between` together, or neither")


@dataclass(frozen=True)
class ShardPass:
    """One function run per shard under a manual computation, on operands and to results labelled as given."""

    shard: Callable[..., Any]
    operands: tuple[tuple[str, ...], ...]
    results: tuple[tuple[str, ...], ...]
    platforms: tuple[str, ...] = ()  # what `shard` is lowered for; empty: this host


def decode_key_split_unsupported(call: CompositeCall) -> str | None:
    """Why a decode's key sequence cannot be cut into ranges run per shard, or None when it can.

    One query row and no bias / mask / left window: its causal or right-window bound is then a key length,
    which each range shifts by its start (as the CPU kernel's decode splits do). masked_value -inf: a
    finite one weighs the masked keys of every range."""
    if call.operand_types[0][0][1] != 1:
        return "more than one query row"
    attrs = AttentionAttrs.from_dict(call.attributes)
    if {"bias", "mask"} & set(attrs.operands) or attrs.window_left != UNBOUNDED:
        return "a bias, a mask or a left window"
    if attrs.zero_empty_rows:
        return "rows that see no key are zeroed (zero_empty_rows), which no range can tell"
    if not math.isinf(attrs.masked_value):
        return "a finite masked_value"
    return None


def decode_key_cuts(call: CompositeCall) -> Cuts:
    """`attention_cuts`, and the key sequence when `decode_key_split_unsupported` allows it."""
    cuts = attention_cuts(call)
    if decode_key_split_unsupported(call) is not None:
        return cuts
    return _with_key_cut(call, cuts)


def prefill_key_split_unsupported(call: CompositeCall) -> str | None:
    """Why a prefill's key sequence cannot be cut into ranges run per shard, or None when it can: ranges
    weigh their keys by log-sum-exp, so masked_value must be -inf, and a bias or mask would have to be cut
    along the keys too (not done)."""
    if (why := prefill_query_split_unsupported(call)) is not None:
        return why
    if not math.isinf(AttentionAttrs.from_dict(call.attributes).masked_value):
        return "a finite masked_value"
    return None


def prefill_query_split_unsupported(call: CompositeCall) -> str | None:
    """Why a prefill's query sequence cannot be cut into ranges run per shard, or None when it can: a bias or
    a mask would have to be cut along the queries too (not done), and the ranges' kernels do not zero empty
    rows."""
    attrs = AttentionAttrs.from_dict(call.attributes)
    if {"bias", "mask"} & set(attrs.operands):
        return "a bias or a mask"
    if attrs.zero_empty_rows:
        return "rows that see no key are zeroed (zero_empty_rows)"
    return None


def key_sequence_cuts(call: CompositeCall) -> Cuts:
    """`attention_cuts`, the key sequence of a decode (`decode_key_split_unsupported`) or of a prefill
    (`prefill_key_split_unsupported`), and a prefill's query sequence (`prefill_query_split_unsupported`),
    where their splits allow it: the cuts of the kernels that take q_offset per batch row. A shard runs one
    key range or one query range, not both (`Cuts.exclusive`: the queries stay whole when both arrive
    sharded)."""
    if call.operand_types[0][0][1] == 1:
        return decode_key_cuts(call)
    cuts = attention_cuts(call)
    if prefill_key_split_unsupported(call) is None:
        cuts = _with_key_cut(call, cuts)
    if prefill_query_split_unsupported(call) is None:
        cuts = _with_sequence_cut(call, cuts, "t", ("q",), call.operand_types[0][0][1], in_results=True)
    if {"s", "t"} <= set(cuts.sizes):  # a shard runs one key range or one query range
        cuts = dataclasses.replace(cuts, exclusive=("s", "t"))
    return cuts


def _with_key_cut(call: CompositeCall, cuts: Cuts) -> Cuts:
    return _with_sequence_cut(call, cuts, "s", ("k", "v"), call.operand_types[1][0][1], in_results=False)


def _with_sequence_cut(call: CompositeCall, cuts: Cuts, label: str, roles: tuple[str, ...], size: int,
                       in_results: bool) -> Cuts:
    """`cuts` with dim 1 (the sequence) of the operands in `roles`, and of the results if `in_results`,
    labelled `label`."""

    def cut(labels: tuple[str, ...]) -> tuple[str, ...]:
        return (labels[0], label, *labels[2:])

    operands = tuple(cut(labels) if role in roles else labels
                     for role, labels in zip(call.attributes["operands"], cuts.operands, strict=True))
    results = tuple(cut(labels) for labels in cuts.results) if in_results else cuts.results
    return Cuts(operands, results, {**cuts.sizes, label: size})


_JNP_DTYPES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}


def _platforms(platform: str | None) -> tuple[str, ...]:
    """The platforms a range's kernel is lowered for: `platform`, or this host's (empty)."""
    return (platform,) if platform is not None else ()


def _merge_ranges(b: int, t: int, n: int, splits: int, dtype: Any) -> Callable[..., Any]:  # noqa: ANN401
    """The merge of a key split: combines the P ranges' (output, lse) exactly (`combine_partials`)."""
    def merge(out: Any, lse: Any) -> Any:  # noqa: ANN401  (B, P, T, N, D), (B, P, T, N)
        d = out.shape[-1]
        merged = combine_partials(out.reshape(b, splits, t * n, d), lse.reshape(b, splits, t * n), "float32")
        return merged.reshape(b, t, n, d).astype(dtype)

    return merge


def decode_key_split(call: CompositeCall, splits: int, run_range: Callable[..., Any],
                     platform: str | None = None) -> RangeSplit:
    """A decode composite as `splits` key ranges, one per shard of its sharded key sequence.

    `prepare` cuts k, v into (B, P, S/P, K, H) and gives each range its key lengths (the composite's and
    the one query's causal / right-window bound, shifted by the range's start); `shard` runs
    `run_range(q, k, v, lengths, scale=, softcap=) -> (out f32, lse)` on one range (a target's kernel,
    lowered for `platform`); `merge` combines the P partial results exactly (`combine_partials`)."""
    attrs = AttentionAttrs.from_dict(call.attributes)
    b, t, n, _ = call.operand_types[0][0]
    s, kv = call.operand_types[1][0][1:3]
    has_lengths = "kv_lengths" in attrs.operands
    per_range = s // splits
    dtype = jnp.dtype(_JNP_DTYPES[call.operand_types[0][1]])

    def prepare(q: Any, k: Any, v: Any, *rest: Any) -> tuple[Any, ...]:  # noqa: ANN401
        limit = jnp.full((b,), s, jnp.int32)
        if has_lengths:
            limit = jnp.minimum(limit, rest[-1].astype(jnp.int32))
        right = 0 if attrs.causal else attrs.window_right
        if right != UNBOUNDED:  # key j is visible from the one query iff j <= q_offset + right
            limit = jnp.minimum(limit, jnp.int32(max(0, attrs.q_offset + right + 1)))
        starts = jnp.arange(splits, dtype=jnp.int32) * per_range
        lengths = jnp.clip(limit[:, None] - starts[None, :], 0, per_range)  # (B, P)
        return (q, *(x.reshape(b, splits, per_range, *x.shape[2:]) for x in (k, v)), lengths)

    def shard(q: Any, k: Any, v: Any, lengths: Any) -> tuple[Any, Any]:  # noqa: ANN401
        out, lse = run_range(q, k[:, 0], v[:, 0], lengths[:, 0], scale=attrs.scale, softcap=attrs.softcap)
        return out[:, None], lse[:, None]

    kv_label = "n" if kv > 1 else ""
    return RangeSplit(prepare=prepare, shard=shard, merge=_merge_ranges(b, t, n, splits, dtype),
                    operands=(("b", "", "n", ""), ("b", "s", "", kv_label, ""), ("b", "s", "", kv_label, ""),
                              ("b", "s")),
                    results=(("b", "s", "", "n", ""), ("b", "s", "", "n")), platforms=_platforms(platform))


def _range_attributes(attrs: AttentionAttrs) -> dict[str, Any]:
    """The attention attributes a prefill range's kernel call takes as they are: the reference's, less q_offset
    (each range has its own) and zero_empty_rows (which the splits refuse)."""
    own = ("q_offset", "zero_empty_rows")
    return {name: value for name, value in attrs.reference_kwargs().items() if name not in own}


def prefill_key_split(call: CompositeCall, splits: int, run_range: Callable[..., Any],
                      platform: str | None = None) -> RangeSplit:
    """A prefill composite (no bias or mask, masked_value -inf) as `splits` key ranges, one per shard.

    Key j of range p is global key p * S/P + j, so the range sees the queries at q_offset - p * S/P: the
    causal / window bounds hold with that offset, which `prepare` gives each (batch row, range) next to
    its key lengths (the composite's kv_lengths, shifted by the range's start). `shard` runs
    `run_range(q, k, v, kv_lengths=, q_offsets=, q_lengths=, **attention attributes) -> (out f32, lse)`
    on one range; `merge` combines the P partial results exactly (`combine_partials`): a row that sees
    no key of a range weighs 0 there, one that sees none of any is NaN, as in the reference."""
    attrs = AttentionAttrs.from_dict(call.attributes)
    b, t, n, _ = call.operand_types[0][0]
    s, kv = call.operand_types[1][0][1:3]
    extra = list(attrs.operands[3:])  # q_lengths and / or kv_lengths, in that order
    per_range = s // splits
    dtype = jnp.dtype(_JNP_DTYPES[call.operand_types[0][1]])
    statics = _range_attributes(attrs)

    def prepare(q: Any, k: Any, v: Any, *rest: Any) -> tuple[Any, ...]:  # noqa: ANN401
        named = dict(zip(extra, rest, strict=True))
        limit = jnp.full((b,), s, jnp.int32)
        if "kv_lengths" in named:
            limit = jnp.minimum(limit, named["kv_lengths"].astype(jnp.int32))
        starts = jnp.arange(splits, dtype=jnp.int32) * per_range
        lengths = jnp.clip(limit[:, None] - starts[None, :], 0, per_range)  # (B, P)
        offsets = jnp.broadcast_to(jnp.int32(attrs.q_offset) - starts[None, :], (b, splits))
        ranges = tuple(x.reshape(b, splits, per_range, *x.shape[2:]) for x in (k, v))
        q_lengths = (named["q_lengths"].astype(jnp.int32),) if "q_lengths" in named else ()
        return (q, *ranges, lengths, offsets, *q_lengths)

    def shard(q: Any, k: Any, v: Any, lengths: Any, offsets: Any, *q_lengths: Any) -> tuple[Any, Any]:  # noqa: ANN401
        out, lse = run_range(q, k[:, 0], v[:, 0], kv_lengths=lengths[:, 0], q_offsets=offsets[:, 0],
                             q_lengths=q_lengths[0] if q_lengths else None, **statics)
        return out[:, None], lse[:, None]

    kv_label = "n" if kv > 1 else ""
    range_labels = ("b", "s", "", kv_label, "")
    return RangeSplit(prepare=prepare, shard=shard, merge=_merge_ranges(b, t, n, splits, dtype),
                    operands=(("b", "", "n", ""), range_labels, range_labels, ("b", "s"), ("b", "s"),
                              *((("b",),) if "q_lengths" in extra else ())),
                    results=(("b", "s", "", "n", ""), ("b", "s", "", "n")), platforms=_platforms(platform))


def prefill_query_split(call: CompositeCall, splits: int, run_range: Callable[..., Any],
                        platform: str | None = None) -> RangeSplit:
    """A prefill composite (no bias or mask) as `splits` query ranges, one per shard of its sharded T.

    Query row i of range p is global row p * T/P + i, at key position i + q_offset + p * T/P: `prepare`
    cuts q into (B, P, T/P, N, H) and gives each (batch row, range) that q_offset and its q_lengths (the
    composite's, shifted by the range's start); `shard` runs `run_range(q, k, v, q_offsets=, q_lengths=,
    kv_lengths=, **attention attributes) -> out` on one range with K and V whole; `merge` is a reshape.
    Rows are independent, so nothing is combined and any masked_value works."""
    attrs = AttentionAttrs.from_dict(call.attributes)
    b, t, n, h = call.operand_types[0][0]
    kv = call.operand_types[1][0][2]
    extra = list(attrs.operands[3:])  # q_lengths and / or kv_lengths, in that order
    per_range = t // splits
    statics = _range_attributes(attrs)

    def prepare(q: Any, k: Any, v: Any, *rest: Any) -> tuple[Any, ...]:  # noqa: ANN401
        named = dict(zip(extra, rest, strict=True))
        starts = jnp.arange(splits, dtype=jnp.int32) * per_range
        offsets = jnp.broadcast_to(jnp.int32(attrs.q_offset) + starts[None, :], (b, splits))
        lengths = []
        if "q_lengths" in named:
            q_len = jnp.minimum(named["q_lengths"].astype(jnp.int32), t)
            lengths.append(jnp.clip(q_len[:, None] - starts[None, :], 0, per_range))  # (B, P)
        if "kv_lengths" in named:
            lengths.append(named["kv_lengths"].astype(jnp.int32))
        return (q.reshape(b, splits, per_range, n, h), k, v, offsets, *lengths)

    def shard(q: Any, k: Any, v: Any, offsets: Any, *lengths: Any) -> tuple[Any]:  # noqa: ANN401
        named = dict(zip(extra, lengths, strict=True))
        q_lengths = named["q_lengths"][:, 0] if "q_lengths" in named else None
        out = run_range(q[:, 0], k, v, q_offsets=offsets[:, 0], q_lengths=q_lengths,
                        kv_lengths=named.get("kv_lengths"), **statics)
        return (out[:, None],)

    def merge(out: Any) -> Any:  # noqa: ANN401  (B, P, T/P, N, D)
        return out.reshape(b, t, n, out.shape[-1])

    kv_label = "n" if kv > 1 else ""
    lengths_labels = {"q_lengths": ("b", "t"), "kv_lengths": ("b",)}
    return RangeSplit(prepare=prepare, shard=shard, merge=merge,
                    operands=(("b", "t", "", "n", ""), ("b", "", kv_label, ""), ("b", "", kv_label, ""), ("b", "t"),
                              *(lengths_labels[role] for role in extra)),
                    results=(("b", "t", "", "n", ""),), platforms=_platforms(platform))


def vocab_split_for(call: CompositeCall, target: str, splits: int) -> RangeSplit | None:
    """How `target`'s per-shard call splits `call`'s vocabulary into `splits` ranges; None if it does not."""
    spec = spec_for(call.name, target)
    return spec.vocab_split(call, target, splits) if spec is not None and spec.vocab_split is not None else None


def why_keys_stay_whole(call: CompositeCall, target: str) -> str | None:
    """Why `target`'s per-shard call keeps `call`'s key sequence whole, for a remark; None when it cuts it into
    ranges, or when the target has no key ranges at all (its spec's `key_split`)."""
    spec = spec_for(call.name, target)
    if spec is None or spec.key_split is None or "s" in _spec_cuts(spec, call, 1).sizes:
        return None
    if call.operand_types[0][0][1] == 1:
        return decode_key_split_unsupported(call)
    if spec.prefill_key_ranges:
        return prefill_key_split_unsupported(call)
    return f"the {target} kernel takes q_offset as a constant, and each key range of a prefill needs its own"


def key_split_for(call: CompositeCall, target: str, splits: int) -> RangeSplit | None:
    """How `target`'s per-shard call splits `call`'s key sequence into `splits` ranges; None if it does not."""
    spec = spec_for(call.name, target)
    return spec.key_split(call, target, splits) if spec is not None and spec.key_split is not None else None


def query_split_for(call: CompositeCall, target: str, splits: int) -> RangeSplit | None:
    """How `target`'s per-shard call splits `call`'s query sequence into `splits` ranges; None if it does not."""
    spec = spec_for(call.name, target)
    return spec.query_split(call, target, splits) if spec is not None and spec.query_split is not None else None


def _spec_cuts(spec: KernelSpec, call: CompositeCall, devices: int) -> Cuts:
    """The dims `spec`'s call keeps local: its own `cuts`, else the composite's (PER_SHARD_CUTS)."""
    return spec.cuts(call, devices) if spec.cuts is not None else PER_SHARD_CUTS[call.name](call)


def cuts_for(call: CompositeCall, target: str, devices: int) -> Cuts | None:
    """The dims `target`'s kernel call for `call` keeps local on `devices` devices; None if unknown."""
    spec = spec_for(call.name, target)
    if spec is None:
        return PER_SHARD_CUTS[call.name](call) if call.name in PER_SHARD_CUTS else None
    return _spec_cuts(spec, call, devices)


@dataclass(frozen=True)
class Mesh:
    name: str
    axes: tuple[tuple[str, int], ...]  # (name, size) in mesh order

    def size(self, axes: Sequence[str]) -> int:
        sizes = dict(self.axes)
        return math.prod(sizes[a] for a in axes)


@dataclass
class ShardPlan:
    """How one composite runs per shard: the mesh axes of each cut factor (an empty tuple keeps it
    whole), and the operand dims that arrive sharded but stay whole (gathered at the boundary)."""

    mesh: Mesh
    cuts: Cuts
    axes: dict[str, tuple[str, ...]]
    gathered: list[str] = field(default_factory=list)

    def shards(self, label: str) -> int:
        return self.mesh.size(self.axes.get(label, ())) if label else 1

    @property
    def is_cut(self) -> bool:
        return any(self.shards(label) > 1 for label in self.axes)

    def local_shape(self, shape: Sequence[int], labels: Sequence[str]) -> tuple[int, ...]:
        return tuple(size // self.shards(label) for size, label in zip(shape, labels, strict=True))

    def whole_shape(self, shape: Sequence[int], labels: Sequence[str]) -> tuple[int, ...]:
        """The whole value's shape for one shard's `shape`."""
        return tuple(size * self.shards(label) for size, label in zip(shape, labels, strict=True))

    def sharding(self, labels: Sequence[str]) -> str:
        """`<@mesh, [{"data"}, {}, ...]>` for a value whose dims carry `labels`."""
        dims = ", ".join("{" + ", ".join(f'"{a}"' for a in self.axes.get(label, ())) + "}" if label else "{}"
                         for label in labels)
        return f"<@{self.mesh.name}, [{dims}]>"

    def drop(self, label: str) -> None:
        """Keeps `label`'s dims whole on every shard."""
        self.axes[label] = ()


def _meshes(module: ir.Operation) -> dict[str, Mesh]:
    return {name: Mesh(name, axes) for name, axes in module_meshes(module).items()}


def inside_manual_computation(op: ir.Operation) -> bool:
    parent = op.parent
    while parent is not None and parent.operation.name != "builtin.module":
        if parent.operation.name == "sdy.manual_computation":
            return True
        parent = parent.operation.parent
    return False


def _probe_rule(cuts: Cuts, op: ir.Operation) -> ir.Attribute:
    """The probe's rule: one shared factor per cut label, every other dim a factor of its own, kept whole."""
    factors = _Factors()
    shared: dict[str, str] = {}
    whole: list[str] = []

    def mapping(value: ir.Value, labels: Sequence[str]) -> list[list[str]]:
        dims: list[list[str]] = []
        for size, label in zip(ir.RankedTensorType(value.type).shape, labels, strict=True):
            if not label:
                whole.append(factors.new(size))
                dims.append([whole[-1]])
                continue
            if label not in shared:
                shared[label] = factors.new(cuts.sizes[label])
            dims.append([shared[label]])
            if size != cuts.sizes[label]:  # the compound (factor, rest)
                whole.append(factors.new(size // cuts.sizes[label]))
                dims[-1].append(whole[-1])
        return dims

    operands = [mapping(v, labels) for v, labels in zip(op.operands, cuts.operands, strict=True)]
    results = [mapping(v, labels) for v, labels in zip(op.results, cuts.results, strict=True)]
    factors.need_replication = whole
    return _rule(operands, results, factors, op.context)


def _axes(sharding: ir.Attribute) -> tuple[str, list[tuple[str, ...] | None]]:
    """(mesh name, the axes of each dim; None for a dim cut by sub-axes) of a `#sdy.sharding`."""
    tensor = sdy.TensorShardingAttr(sharding)
    mesh = str(tensor.mesh_or_ref).lstrip("@")
    dims: list[tuple[str, ...] | None] = []
    for dim in tensor.dimension_shardings:
        refs = [sdy.AxisRefAttr(a) for a in sdy.DimensionShardingAttr(dim).axes]
        dims.append(None if any(r.sub_axis_info is not None for r in refs) else tuple(r.name for r in refs))
    return mesh, dims


def _value_sharding(value: ir.Value) -> ir.Attribute | None:
    """The `#sdy.sharding` propagation gave `value` (on its defining op, or on its function argument)."""
    owner = value.owner
    if isinstance(owner, ir.Block):
        parent = owner.owner.operation
        if parent.name != "func.func" or "arg_attrs" not in parent.attributes:
            return None
        attrs = ir.DictAttr(ir.ArrayAttr(parent.attributes["arg_attrs"])[ir.BlockArgument(value).arg_number])
        return attrs[SHARDING_ATTR] if SHARDING_ATTR in attrs else None
    op = owner if isinstance(owner, ir.Operation) else owner.operation
    if SHARDING_ATTR not in op.attributes:
        return None
    per_value = sdy.TensorShardingPerValueAttr(op.attributes[SHARDING_ATTR])
    return per_value.shardings[ir.OpResult(value).result_number]


def _plan(probe: ir.Operation, cuts: Cuts, meshes: dict[str, Mesh], roles: Sequence[str]) -> ShardPlan | None:
    arrivals = [_value_sharding(value) for value in probe.operands]
    if SHARDING_ATTR in probe.attributes:
        result = sdy.TensorShardingPerValueAttr(probe.attributes[SHARDING_ATTR]).shardings[0]
        mesh_name, dims = _axes(result)
    else:  # propagation leaves a replicated result unannotated
        names = {_axes(a)[0] for a in arrivals if a is not None} or set(meshes)
        if len(names) != 1:
            return None
        mesh_name, dims = names.pop(), [()] * len(cuts.results[0])
    if mesh_name not in meshes:
        return None
    axes: dict[str, tuple[str, ...]] = {}
    for label, dim_axes in zip(cuts.results[0], dims, strict=True):
        if label and label not in axes:
            axes[label] = dim_axes or ()  # a sub-axis split stays whole: gathered, never wrong
    for label in set(cuts.sizes) - set(axes):  # in no result (a key sequence, a vocabulary): as it arrives
        axes[label] = next((_axes(arrival)[1][dim] or () for arrival, labels in zip(arrivals, cuts.operands,
                                                                                   strict=True)
                            if arrival is not None for dim, lab in enumerate(labels) if lab == label), ())
    plan = ShardPlan(meshes[mesh_name], cuts, axes)
    for label in list(axes):
        if not _splits_evenly(probe, cuts, label, plan.shards(label)):
            plan.drop(label)
    for label in [label for label in cuts.exclusive if plan.shards(label) > 1][1:]:
        plan.drop(label)
    for role, sharding, labels in zip(roles, arrivals, cuts.operands, strict=True):
        if sharding is None:
            continue
        _, arrived = _axes(sharding)
        for dim, (label, dim_axes) in enumerate(zip(labels, arrived, strict=True)):
            wanted = plan.axes.get(label, ()) if label else ()
            if dim_axes is None or dim_axes and tuple(dim_axes) != wanted:
                plan.gathered.append(f"{role} dim {dim} (over {', '.join(dim_axes or ['sub-axes'])})")
    return plan


def _splits_evenly(probe: ir.Operation, cuts: Cuts, label: str, shards: int) -> bool:
    """Whether every dim labelled `label`, and the label's factor (K in GQA's query heads N = (K, G)),
    divides into `shards` parts."""
    sizes = [size for values, labelling in ((probe.operands, cuts.operands), (probe.results, cuts.results))
             for value, labels in zip(values, labelling, strict=True)
             for size, dim_label in zip(_dims(value), labels, strict=True) if dim_label == label]
    return all(size % shards == 0 for size in (*sizes, cuts.sizes[label]))


def composites_in(root: ir.Operation) -> list[ir.Operation]:
    """Every `stablehlo.composite` under `root`, in walk order."""
    found: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == "stablehlo.composite":
            found.append(op)
        return ir.WalkResult.ADVANCE

    root.walk(visit)
    return found


def plan_shards(module: ir.Operation, composites: Sequence[ir.Operation], calls: Sequence[CompositeCall],
                target: str, devices: int) -> list[ShardPlan | None]:
    """Each composite's per-shard plan, from Shardy's propagation on a copy of `module` in which the
    composites are probes; None where the composite sits in a manual computation already (a shard_map
    body, whose shapes are local), has nothing to cut, or propagation names no mesh for it."""
    meshes = _meshes(module)
    if not meshes:
        return [None] * len(composites)
    copy = module.clone()
    originals, copies = composites_in(module), composites_in(copy)  # the same walk order
    probes: list[tuple[ir.Operation, Cuts] | None] = []
    for composite, call in zip(composites, calls, strict=True):
        cuts = cuts_for(call, target, devices)
        mirror = next((twin for original, twin in zip(originals, copies, strict=True) if original == composite),
                      None)
        if cuts is None or mirror is None or inside_manual_computation(composite):
            probes.append(None)
            continue
        with mirror.location, ir.InsertionPoint(mirror):
            probe = stablehlo.CustomCallOp([r.type for r in mirror.results], list(mirror.operands),
                                           call_target_name=PROBE_TARGET)
        probe.attributes["sdy.sharding_rule"] = _probe_rule(cuts, probe.operation)
        for old, new in zip(mirror.results, probe.results, strict=True):
            old.replace_all_uses_with(new)
        mirror.erase()
        probes.append((probe.operation, cuts))
    try:
        passmanager.PassManager.parse(PROPAGATION, context=module.context).run(copy)
    except ir.MLIRError:  # a module Shardy cannot propagate: no plans, so nothing is lowered per shard
        return [None] * len(composites)
    plans: list[ShardPlan | None] = []
    for entry, call in zip(probes, calls, strict=True):
        if entry is None:
            plans.append(None)
            continue
        roles = list(call.attributes.get("operands", [])) or ["logits", "key"][:len(call.operand_types)]
        plans.append(_plan(entry[0], entry[1], meshes, roles))
    return plans


def local_call(call: CompositeCall, plan: ShardPlan) -> CompositeCall:
    """`call` as one shard sees it: its operand shapes, and head counts, per shard."""
    types = tuple((plan.local_shape(shape, labels), dtype)
                  for (shape, dtype), labels in zip(call.operand_types, plan.cuts.operands, strict=True))
    attributes = dict(call.attributes)
    if call.name == "hlofuse.attention":
        attributes["num_heads"] = types[0][0][2]
        attributes["num_kv_heads"] = types[1][0][2]
    return CompositeCall(call.name, call.version, attributes, types)


def manual_computation(anchor: ir.Operation, plan: ShardPlan, callee: str, operands: Sequence[ir.Value],
                       operand_labels: Sequence[Sequence[str]], result_types: Sequence[ir.Type],
                       result_labels: Sequence[Sequence[str]]) -> list[ir.Value]:
    """A `sdy.manual_computation` over every mesh axis, before `anchor`, whose body calls `callee` (lowered
    for one shard's shapes) on `operands`; returns its results (of the whole `result_types`)."""
    context = anchor.context

    def local_type(rtype: ir.Type, labels: Sequence[str]) -> ir.Type:
        ranked = ir.RankedTensorType(rtype)
        return ir.RankedTensorType.get(list(plan.local_shape(ranked.shape, labels)), ranked.element_type)

    def per_value(labelling: Sequence[Sequence[str]]) -> ir.Attribute:
        text = "#sdy.sharding_per_value<[" + ", ".join(plan.sharding(x) for x in labelling) + "]>"
        return ir.Attribute.parse(text, context)

    manual = ", ".join(f'"{name}"' for name, _ in plan.mesh.axes)
    with anchor.location, ir.InsertionPoint(anchor):
        op = ir.Operation.create(
            "sdy.manual_computation", results=list(result_types), operands=list(operands),
            attributes={"in_shardings": per_value(operand_labels), "out_shardings": per_value(result_labels),
                        "manual_axes": ir.Attribute.parse(f"#sdy<manual_axes{{{manual}}}>", context)},
            regions=1)
        block = op.regions[0].blocks.append(*(local_type(v.type, labels) for v, labels in zip(operands, operand_labels,
                                                                                                strict=True)))
        with ir.InsertionPoint(block):
            call = func.CallOp([local_type(t, labels) for t, labels in zip(result_types, result_labels, strict=True)],
                               ir.FlatSymbolRefAttr.get(callee), list(block.arguments))
            sdy.ReturnOp(list(call.results))
    return list(op.results)


def wrap_in_manual_computation(composite: ir.Operation, plan: ShardPlan, callee: str) -> None:
    """Replaces `composite` by a `manual_computation` whose body calls `callee` (the kernel lowered for one
    shard's shapes) on the composite's operands."""
    results = manual_computation(composite, plan, callee, list(composite.operands), plan.cuts.operands,
                                 [r.type for r in composite.results], plan.cuts.results)
    for old, new in zip(composite.results, results, strict=True):
        old.replace_all_uses_with(new)
    composite.erase()


def sampled_rows(call: CompositeCall, cuts: Cuts, kernel: Lowered) -> RangeSplit:
    """A stochastic sampler whose rows are cut: `prepare` adds the global index of each slice of the cut row dim
    (its iota times the rows after it, an operand cut like that dim), and each shard runs `kernel(logits, key,
    row_offset=)` with its element 0, so that it draws the noise of its rows of the whole batch."""
    shape = call.operand_types[0][0]
    dim = cuts.operands[0].index("r")
    stride = math.prod(shape[dim + 1:-1])

    def prepare(logits: Any, key: Any) -> tuple[Any, Any, Any]:  # noqa: ANN401
        return logits, key, jax.lax.iota(jnp.int32, shape[dim]) * jnp.int32(stride)

    def shard(logits: Any, key: Any, row_ids: Any) -> tuple[Any]:  # noqa: ANN401
        return (kernel.fn(logits, key, row_offset=row_ids[0]),)

    def merge(ids: Any) -> Any:  # noqa: ANN401
        return ids

    return RangeSplit(prepare=prepare, shard=shard, merge=merge, operands=(*cuts.operands, ("r",)),
                      results=cuts.results, platforms=kernel.platforms)


__all__ = ["PER_SHARD_CUTS", "Cuts", "RangeSplit", "ShardPass",
           "ShardPlan", "attention_cuts", "composites_in", "cuts_for", "decode_key_cuts", "decode_key_split",
           "decode_key_split_unsupported", "inside_manual_computation", "key_sequence_cuts", "key_split_for",
           "local_call", "manual_computation", "plan_shards", "prefill_key_split", "prefill_key_split_unsupported",
           "prefill_query_split", "prefill_query_split_unsupported", "query_split_for", "sample_cuts", "sampled_rows",
           "vocab_split_for", "why_keys_stay_whole", "wrap_in_manual_computation"]
