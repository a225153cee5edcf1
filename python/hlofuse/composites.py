"""The composite contract, re-exported: names, versions and attributes of the ops hlofuse raises.

The contract lives in one module per composite, `hlofuse.ops.attention` and `hlofuse.ops.sample`; import from
there. This module keeps the names that code written against it imports.
"""

from __future__ import annotations

from hlofuse.ops.attention import (
    ATTENTION,
    ATTENTION_OPERANDS,
    ATTENTION_VERSION,
    DECODE_MAX_QUERIES,
    AttentionAttrs,
    is_decode,
    mask_kind,
)
from hlofuse.ops.attributes import attribute_values
from hlofuse.ops.sample import SAMPLE, SAMPLE_VERSION, SampleAttrs

__all__ = ["ATTENTION", "ATTENTION_OPERANDS", "ATTENTION_VERSION", "DECODE_MAX_QUERIES", "SAMPLE", "SAMPLE_VERSION",
           "AttentionAttrs", "SampleAttrs", "attribute_values", "is_decode", "mask_kind"]
