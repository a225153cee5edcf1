"""A composite's attribute dictionary as Python values (what the attribute dataclasses are built from)."""

from __future__ import annotations

from typing import Any

from jaxlib.mlir import ir


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
    if isinstance(attr, ir.DictAttr):
        return {named.name: _python_value(named.attr) for named in attr}
    raise ValueError(f"unsupported attribute {attr}")


__all__ = ["attribute_values"]
