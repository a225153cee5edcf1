"""The CPU kernel calls' sharding rules, re-exported: the code lives in hlofuse.partition.rules.

Import from hlofuse.partition.rules; this module keeps the names that code written against it imports.
"""

from __future__ import annotations

from hlofuse.partition.rules import (
    RULE_ATTR,
    annotate,
    annotate_if_partitioned,
    annotate_op,
    attention_rule,
    device_count,
    foreign_rule,
    is_partitioned,
    module_meshes,
    sample_rule,
    split_shared_iotas,
)

__all__ = ["RULE_ATTR", "annotate", "annotate_if_partitioned", "annotate_op", "attention_rule", "device_count",
           "foreign_rule", "is_partitioned", "module_meshes", "sample_rule", "split_shared_iotas"]
