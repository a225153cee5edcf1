"""The samplers' vocabulary ranges, re-exported: the code lives in hlofuse.partition.vocab_ranges.

Import from hlofuse.partition.vocab_ranges; this module keeps the names that code written against it imports.
"""

from __future__ import annotations

from hlofuse.partition.vocab_ranges import rank_top_k_ranges, sampled_ranges, top_k_mask_ranges

__all__ = ["rank_top_k_ranges", "sampled_ranges", "top_k_mask_ranges"]
