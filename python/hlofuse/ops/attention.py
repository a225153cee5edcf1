"""The `hlofuse.attention` composite: its name, version, operands and attributes (docs/composites.md).

`AttentionAttrs` reads the attributes back from IR, so that every lowering (and the reference used in tests)
interprets a composite in one way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from jaxlib.mlir import ir

from hlofuse.ops.attributes import attribute_values

ATTENTION = "hlofuse.attention"
ATTENTION_VERSION = 1
ATTENTION_OPERANDS = ("q", "k", "v", "bias", "mask", "q_lengths", "kv_lengths")


# A site is a decode when a few queries attend to a longer KV cache.
DECODE_MAX_QUERIES = 8


def mask_kind(roles: Sequence[str]) -> str:
    """The `mask_kind` attribute from the operands present: `none` or `+`-joined additive/boolean/lengths."""
    kinds = [kind for kind, role in (("additive", "bias"), ("boolean", "mask")) if role in roles]
    if "q_lengths" in roles or "kv_lengths" in roles:
        kinds.append("lengths")
    return "+".join(kinds) or "none"


def is_decode(queries: int, keys: int) -> bool:
    return queries <= DECODE_MAX_QUERIES < keys


@dataclass(frozen=True)
class AttentionAttrs:
    """Attributes of `hlofuse.attention` v1. Operands are canonical: q (B,T,N,H), k (B,S,K,H), v (B,S,K,D),
    then, as `operands` lists them, bias / mask (B|1,N|1,T|1,S|1), q_lengths / kv_lengths (B,) int32."""

    scale: float
    causal: bool = False
    window_left: int = -1
    window_right: int = -1
    q_offset: int = 0
    softcap: float = 0.0
    masked_value: float = float("-inf")
    mask_kind: str = "none"
    num_heads: int = 1
    num_kv_heads: int = 1
    layout: str = "BTNH"
    decode: bool = False
    zero_empty_rows: bool = False
    operands: tuple[str, ...] = ("q", "k", "v")

    @staticmethod
    def from_ir(attributes: ir.Attribute) -> AttentionAttrs:
        """The attributes of a composite's `composite_attributes` dictionary."""
        return AttentionAttrs.from_dict(attribute_values(attributes))

    @staticmethod
    def from_dict(attributes: dict[str, Any]) -> AttentionAttrs:
        """The attributes of a `CompositeCall`; raises ValueError naming any this version does not have."""
        values = dict(attributes)
        values["operands"] = tuple(values.get("operands", ("q", "k", "v")))
        known = {f.name for f in dataclasses.fields(AttentionAttrs)}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"unknown hlofuse.attention attributes {sorted(unknown)}")
        return AttentionAttrs(**values)

    def reference_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of hlofuse.kernels.reference.attention_reference."""
        return {"scale": self.scale, "causal": self.causal, "window_left": self.window_left,
                "window_right": self.window_right, "q_offset": self.q_offset, "softcap": self.softcap,
                "masked_value": self.masked_value, "zero_empty_rows": self.zero_empty_rows}

    def bind_operands(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """`fn(q, k, v, **optional_operands, **attrs)` as a function of the composite's operands."""
        roles = self.operands
        kwargs = self.reference_kwargs()

        def call(*operands: Any) -> Any:  # noqa: ANN401
            named = dict(zip(roles, operands, strict=True))
            q, k, v = named.pop("q"), named.pop("k"), named.pop("v")
            return fn(q, k, v, **named, **kwargs)

        return call


__all__ = ["ATTENTION", "ATTENTION_OPERANDS", "ATTENTION_VERSION", "DECODE_MAX_QUERIES", "AttentionAttrs", "is_decode",
           "mask_kind"]
