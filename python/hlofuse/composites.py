"""The composite contract: names, versions and attributes of the ops hlofuse raises.

docs/composites.md documents the same fields; `AttentionAttrs` reads them back from IR so that every
lowering (and the reference used in tests) interprets a composite in one way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from jaxlib.mlir import ir

ATTENTION = "hlofuse.attention"
ATTENTION_VERSION = 1
ATTENTION_OPERANDS = ("q", "k", "v", "bias", "mask", "q_lengths", "kv_lengths")
SAMPLE = "hlofuse.sample"
SAMPLE_VERSION = 1


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
        return AttentionAttrs.from_dict(attribute_values(attributes))

    @staticmethod
    def from_dict(attributes: dict[str, Any]) -> AttentionAttrs:
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


@dataclass(frozen=True)
class SampleAttrs:
    """Attributes of `hlofuse.sample` v1. Operands: logits (..., V) float, key (2,) uint32 (threefry2x32).
    The result is the token id per row, int32, of shape logits.shape[:-1].

    `form` names the sampler as written (hlofuse.kernels.sampling_reference.FORMS): it fixes the order of
    temperature and filters, where the Gumbel noise is indexed (vocabulary id or rank) and the tie rules.
    """

    mode: str  # greedy | temperature | top_k | top_p | min_p | top_k+top_p
    form: str
    temperature: float = 1.0
    k: int = 0  # 0 = no top-k
    p: float = 1.0  # 1 = no top-p
    min_p: float = 0.0  # 0 = no min-p

    @staticmethod
    def from_ir(attributes: ir.Attribute) -> SampleAttrs:
        return SampleAttrs.from_dict(attribute_values(attributes))

    @staticmethod
    def from_dict(attributes: dict[str, Any]) -> SampleAttrs:
        known = {f.name for f in dataclasses.fields(SampleAttrs)}
        unknown = set(attributes) - known
        if unknown:
            raise ValueError(f"unknown hlofuse.sample attributes {sorted(unknown)}")
        return SampleAttrs(**attributes)

    def ir_attributes(self) -> dict[str, ir.Attribute]:
        """The composite_attributes dictionary (call inside an MLIR context)."""
        f64, i64 = ir.F64Type.get(), ir.IntegerType.get_signless(64)
        return {"mode": ir.StringAttr.get(self.mode), "form": ir.StringAttr.get(self.form),
                "temperature": ir.FloatAttr.get(f64, self.temperature), "k": ir.IntegerAttr.get(i64, self.k),
                "p": ir.FloatAttr.get(f64, self.p), "min_p": ir.FloatAttr.get(f64, self.min_p)}

    def params(self) -> dict[str, Any]:
        """Keyword arguments of the form's function (hlofuse.kernels.sampling_reference): the parameters
        the form reads, the others at their neutral values (`form_params`)."""
        from hlofuse.kernels.sampling_reference import FORMS, form_params

        values = {"temperature": self.temperature, "k": self.k, "p": self.p, "min_p": self.min_p}
        return form_params(self.form, **values) if self.form in FORMS else values


def attribute_values(attributes: ir.Attribute) -> dict[str, Any]:
    """A composite's attribute dictionary as Python values."""
    return {named.name: _python_value(named.attr) for named in ir.DictAttr(attributes)}


def _python_value(attr: ir.Attribute) -> Any:  # noqa: ANN401
    if isinstance(attr, ir.BoolAttr):
        return bool(attr.value)
    if isinstance(attr, ir.IntegerAttr):
        return int(attr.value)
    if isinstance(attr, ir.FloatAttr):
        return float(attr.value)
    if isinstance(attr, ir.StringAttr):
        return attr.value
    if isinstance(attr, ir.ArrayAttr):
        return [_python_value(a) for a in attr]
    raise ValueError(f"unsupported attribute {attr}")
