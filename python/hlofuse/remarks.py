"""Remarks: why a near-miss was not fused, tied to the op's source location."""

from __future__ import annotations

import re
from dataclasses import dataclass

from jaxlib.mlir import ir

_FILE_LINE_COL = re.compile(r'"([^"]*)":(\d+):(\d+)')


def format_location(location: ir.Location) -> str:
    """`file:line:col` like mlir-opt diagnostics, or the raw location text when it has no file."""
    text = str(location)
    found = _FILE_LINE_COL.search(text)
    if found:
        return f"{found.group(1)}:{found.group(2)}:{found.group(3)}"
    return text


@dataclass(frozen=True)
class Remark:
    """One near-miss: `pass_name` saw `op_name` at `location` and did not rewrite it because `reason`."""

    pass_name: str
    op_name: str
    location: str
    reason: str

    def __str__(self) -> str:
        return f"{self.location}: remark: [{self.pass_name}] {self.op_name}: {self.reason}"


def remark_at(pass_name: str, op: ir.Operation | ir.OpView, reason: str) -> Remark:
    operation = op.operation
    return Remark(pass_name, operation.name, format_location(operation.location), reason)
