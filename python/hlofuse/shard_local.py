"""Per-shard kernel calls, re-exported: the code lives in hlofuse.partition (cuts, plan, ranges, manual).

Import from hlofuse.partition; this module keeps the names that code written against it imports.
"""

from __future__ import annotations

from hlofuse.partition.cuts import (
    Cuts,
    attention_cuts,
    cuts_for,
    decode_key_cuts,
    decode_key_split_unsupported,
    key_sequence_cuts,
    prefill_key_split_unsupported,
    prefill_query_split_unsupported,
    sample_cuts,
)
from hlofuse.partition.manual import manual_computation, wrap_in_manual_computation
from hlofuse.partition.plan import (
    GatheredDim,
    Mesh,
    ShardPlan,
    composites_in,
    inside_manual_computation,
    local_call,
    plan_shards,
)
from hlofuse.partition.ranges import (
    RangeSplit,
    ShardPass,
    decode_key_split,
    key_split_for,
    prefill_key_split,
    prefill_query_split,
    query_split_for,
    sampled_rows,
    vocab_split_for,
    why_keys_stay_whole,
)

__all__ = ["Cuts", "GatheredDim", "Mesh", "RangeSplit", "ShardPass", "ShardPlan", "attention_cuts", "composites_in",
           "cuts_for", "decode_key_cuts", "decode_key_split", "decode_key_split_unsupported",
           "inside_manual_computation", "key_sequence_cuts", "key_split_for", "local_call", "manual_computation",
           "plan_shards", "prefill_key_split", "prefill_key_split_unsupported", "prefill_query_split",
           "prefill_query_split_unsupported", "query_split_for", "sample_cuts", "sampled_rows", "vocab_split_for",
           "why_keys_stay_whole", "wrap_in_manual_computation"]
