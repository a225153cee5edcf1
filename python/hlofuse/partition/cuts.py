"""The dims a kernel call can cut: `Cuts`, one factor label per operand and result dim.

A label names a factor that a per-shard call (or XLA's batch partitioner) keeps local; "" keeps the dim whole.
attention: "b" batch, "n" heads (kv heads when K > 1), "s" the key sequence, "t" the query sequence;
sampling: "r" the first row dim longer than 1, "v" the vocabulary. The key and query sequences are cut only
where their range splits (hlofuse.partition.ranges) merge them exactly, which the `*_split_unsupported`
predicates here decide. Which cuts a target's call takes is its `KernelSpec.cuts` (`cuts_for`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from hlofuse.kernels import CompositeCall, KernelSpec, spec_for
from hlofuse.kernels.reference import UNBOUNDED
from hlofuse.ops.attention import ATTENTION, AttentionAttrs
from hlofuse.ops.sample import SAMPLE


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


# The dims a per-shard call of each composite cuts when its spec names no `cuts` of its own.
_COMPOSITE_CUTS: Mapping[str, Callable[[CompositeCall], Cuts]] = MappingProxyType({
    ATTENTION: attention_cuts,
    SAMPLE: sample_cuts,
})


def _composite_cuts(call: CompositeCall) -> Cuts:
    return _COMPOSITE_CUTS[call.name](call)


def default_cuts(call: CompositeCall) -> Cuts | None:
    """The composite's batch / heads (attention) or rows (sampling) for a call of a composite no target
    describes; None for a composite without cuts."""
    return _COMPOSITE_CUTS[call.name](call) if call.name in _COMPOSITE_CUTS else None


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


def spec_cuts(spec: KernelSpec, call: CompositeCall, devices: int) -> Cuts:
    """The dims `spec`'s call keeps local: its own `cuts`, else the composite's (default_cuts)."""
    return spec.cuts(call, devices) if spec.cuts is not None else _composite_cuts(call)


def cuts_for(call: CompositeCall, target: str, devices: int) -> Cuts | None:
    """The dims `target`'s kernel call for `call` keeps local on `devices` devices; None if unknown."""
    spec = spec_for(call.name, target)
    if spec is None:
        return default_cuts(call)
    return spec_cuts(spec, call, devices)


__all__ = ["Cuts", "attention_cuts", "cuts_for", "decode_key_cuts", "decode_key_split_unsupported", "default_cuts",
           "key_sequence_cuts", "prefill_key_split_unsupported", "prefill_query_split_unsupported", "sample_cuts",
           "spec_cuts"]
