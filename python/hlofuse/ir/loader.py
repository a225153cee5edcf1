"""Reads a program in any form JAX or XLA leaves on disk and returns it as a StableHLO module.

The format is detected from the bytes, never from the file name or a flag:

  mlir-text        StableHLO/MLIR text: hand-written lit inputs, `--xla_dump_to` `module.mlir`,
                   `JAX_DUMP_IR_TO` `jax_irNNNN_<name>_compile.mlir`
  mlir-bytecode    MLIR bytecode (magic `ML\\xefR`) written by jaxlib's MLIR
  vhlo-artifact    a StableHLO portable artifact (VHLO bytecode, producer `StableHLO_v...`)
  jax-export       `jax.export.Exported.serialize()` (a flatbuffer that embeds a VHLO artifact)
  hlo-text         XLA HLO text: `--xla_dump_to` `*.before_optimizations.txt`
  hlo-proto        a serialized `HloProto` (`*.hlo.pb` dumps; field 1 is the HloModuleProto)
  hlo-module-proto a bare serialized `HloModuleProto`

Every failure raises `LoadError` whose message is one line, with `file:line:col:` where MLIR gave one.
"""

from __future__ import annotations

import re
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from jaxlib.mlir import ir

from hlofuse.ir.context import make_context
from hlofuse.remarks import format_location

BYTECODE_MAGIC = b"ML\xefR"
# What the MLIR text parser calls its buffer; diagnostics and locations are renamed to the real input.
PARSER_BUFFER_NAME = "-"
STDIN_NAME = "<stdin>"

FORMATS = (
    "mlir-text",
    "mlir-bytecode",
    "vhlo-artifact",
    "jax-export",
    "hlo-text",
    "hlo-proto",
    "hlo-module-proto",
)


class LoadError(ValueError):
    """An input that cannot be read or parsed; `str()` is one line ready to print."""


@dataclass
class Loaded:
    """A parsed module, the format it came in, and the name diagnostics use for it."""

    module: ir.Module
    format: str
    name: str


def read_input(path: str) -> bytes:
    """The bytes of `path`, or of stdin for '-'."""
    if path == "-":
        return sys.stdin.buffer.read()
    try:
        return Path(path).read_bytes()
    except IsADirectoryError:
        raise LoadError(
            f"{path}: error: is a directory (pass one file from it, e.g. its module.mlir)"
        ) from None
    except OSError as error:
        raise LoadError(f"{path}: error: cannot read input: {error.strerror or error}") from None


def display_name(path: str) -> str:
    return STDIN_NAME if path == "-" else path


# ---- detection ----------------------------------------------------------------------------------------


def _bytecode_producer(data: bytes) -> str:
    """The producer string of MLIR bytecode: after the magic and a one-byte version varint."""
    end = data.find(b"\x00", 5, 128)
    return data[5:end].decode("ascii", "replace") if end > 0 else ""


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while pos < len(data) and shift < 64:
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise ValueError("truncated varint")


def _first_proto_field(data: bytes) -> bytes | None:
    """The payload of a leading length-delimited field 1 (tag 0x0a), or None if `data` has none."""
    if not data or data[0] != 0x0A:
        return None
    try:
        length, start = _varint(data, 1)
    except ValueError:
        return None
    if start + length > len(data):
        return None
    return data[start : start + length]


def _is_name(payload: bytes) -> bool:
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return len(text) < 1024 and text.isprintable()


_CONTROL = re.compile(rb"[\x00-\x08\x0e-\x1f]")


def _as_text(data: bytes) -> str | None:
    """`data` decoded, if it is text: UTF-8 without control bytes (which protos and flatbuffers have)."""
    if _CONTROL.search(data, 0, 4096):
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


_HLO_TEXT = re.compile(r"\A(?:\s|//[^\n]*\n)*HloModule\s")


def detect_format(data: bytes) -> str:
    """One of FORMATS, from the content alone. Raises LoadError for bytes no reader accepts."""
    if data.startswith(BYTECODE_MAGIC):
        return "vhlo-artifact" if _bytecode_producer(data).startswith("StableHLO") else "mlir-bytecode"
    text = _as_text(data)
    if text is not None:
        return "hlo-text" if _HLO_TEXT.match(text) else "mlir-text"
    payload = _first_proto_field(data)
    if payload is not None:
        return "hlo-module-proto" if _is_name(payload) else "hlo-proto"
    if len(data) >= 8 and struct.unpack_from("<I", data)[0] < len(data) and BYTECODE_MAGIC in data:
        return "jax-export"
    raise LoadError(
        "unrecognised input: not MLIR text or bytecode, HLO text or proto, or a jax.export artifact"
    )


# ---- diagnostics --------------------------------------------------------------------------------------


def format_diagnostic(location: ir.Location | str, severity: str, message: str, name: str) -> str:
    """`name:line:col: severity: message` (the parser's own buffer name replaced by `name`)."""
    where = format_location(location) if isinstance(location, ir.Location) else location
    if where.startswith(PARSER_BUFFER_NAME + ":"):
        where = name + where[len(PARSER_BUFFER_NAME) :]
    elif not re.match(r"[^:]+:\d+:\d+$", where):
        where = name
    return f"{where}: {severity}: {' '.join(message.split())}"


def format_mlir_error(error: ir.MLIRError, name: str, *, notes: bool = False) -> list[str]:
    """One line per error diagnostic in `error` (plus its notes if asked); the message if there are none."""
    lines = []
    for diagnostic in error.error_diagnostics:
        lines.append(format_diagnostic(diagnostic.location, "error", diagnostic.message, name))
        if notes:
            lines += [format_diagnostic(n.location, "note", n.message, name) for n in diagnostic.notes]
    if not lines:
        lines.append(f"{name}: error: {' '.join(str(error.message).split())}")
    return lines


def _mlir_error(error: ir.MLIRError, name: str, what: str) -> LoadError:
    lines = format_mlir_error(error, name)
    if not error.error_diagnostics:
        lines = [f"{name}: error: {what}: {' '.join(str(error.message).split())}"]
    return LoadError(lines[0])


# ---- locations ----------------------------------------------------------------------------------------


def _rename_location(location: ir.Location, name: str) -> ir.Location | None:
    """`location` with the parser's buffer name replaced by `name`, or None when it names another file."""
    try:
        if location.filename != PARSER_BUFFER_NAME:  # only file:line:col locations have a filename
            return None
        return ir.Location.file(name, location.start_line, location.start_col, context=location.context)
    except (AttributeError, ValueError):
        return None


def rename_source_locations(module: ir.Module, name: str) -> None:
    """Points the plain `"-":line:col` locations the text parser assigns at the real input `name`,
    so remarks and `--mlir-print-debuginfo` name the file, as mlir-opt does."""

    def visit(op: ir.Operation) -> ir.WalkResult:
        renamed = _rename_location(op.location, name)
        if renamed is not None:
            op.location = renamed
        for region in op.regions:
            for block in region.blocks:
                for argument in block.arguments:
                    renamed = _rename_location(argument.location, name)
                    if renamed is not None:
                        argument.set_location(renamed)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)


# ---- readers ------------------------------------------------------------------------------------------


def _parse(source: str | bytes, context: ir.Context, name: str, what: str) -> ir.Module:
    with context:
        try:
            return ir.Module.parse(source)
        except ir.MLIRError as error:
            raise _mlir_error(error, name, what) from None


def _from_mlir_text(data: bytes, context: ir.Context, name: str) -> ir.Module:
    module = _parse(data.decode("utf-8"), context, name, "cannot parse MLIR text")
    rename_source_locations(module, name)
    return module


def _from_bytecode(data: bytes, context: ir.Context, name: str) -> ir.Module:
    return _parse(data, context, name, "cannot parse MLIR bytecode")


def _from_vhlo(data: bytes, context: ir.Context, name: str) -> ir.Module:
    from jaxlib.mlir.dialects import stablehlo

    with context:
        try:
            return stablehlo.deserialize_portable_artifact(context, data)
        except ir.MLIRError as error:
            raise _mlir_error(error, name, "cannot read StableHLO portable artifact") from None
        except Exception as error:  # the binding raises a plain exception for a corrupt artifact
            raise LoadError(f"{name}: error: cannot read StableHLO portable artifact: {error}") from None


def _embedded_artifact(data: bytes) -> bytes | None:
    """Without the flatbuffers package: the VHLO bytes stored as a flatbuffer byte vector
    (a little-endian uint32 length, then the bytes) that starts with the bytecode magic."""
    start = data.find(BYTECODE_MAGIC)
    if start < 4:
        return None
    (length,) = struct.unpack_from("<I", data, start - 4)
    return data[start : start + length] if start + length <= len(data) else None


def _from_jax_export(data: bytes, context: ir.Context, name: str) -> ir.Module:
    try:
        import jax.export

        exported = jax.export.deserialize(bytearray(data))
    except ImportError:  # jax needs the optional `flatbuffers` package to read artifacts
        artifact = _embedded_artifact(data)
        if artifact is None:
            raise LoadError(
                f"{name}: error: cannot read jax.export artifact (install 'flatbuffers' to read it fully)"
            ) from None
        return _from_vhlo(artifact, context, name)
    except Exception as error:
        raise LoadError(f"{name}: error: cannot read jax.export artifact: {error}") from None
    return _parse(exported.mlir_module(), context, name, "cannot parse jax.export module")


def _from_hlo_module_proto(proto: bytes, context: ir.Context, name: str) -> ir.Module:
    from jax._src.lib import _jax

    try:
        bytecode = _jax.mlir.hlo_to_stablehlo(proto)
    except Exception as error:
        raise LoadError(f"{name}: error: cannot convert HLO to StableHLO: {error}") from None
    return _parse(bytecode, context, name, "cannot parse converted HLO")


def _from_hlo_text(data: bytes, context: ir.Context, name: str) -> ir.Module:
    from jaxlib import _hlo

    try:
        proto = _hlo.hlo_module_from_text(data.decode("utf-8")).as_serialized_hlo_module_proto()
    except Exception as error:
        message = " ".join(str(error).split())
        raise LoadError(f"{name}: error: cannot parse HLO text: {message}") from None
    return _from_hlo_module_proto(proto, context, name)


def _from_hlo_proto(data: bytes, context: ir.Context, name: str) -> ir.Module:
    payload = _first_proto_field(data)
    assert payload is not None  # detect_format checked it
    return _from_hlo_module_proto(payload, context, name)


_READERS: dict[str, Callable[[bytes, ir.Context, str], ir.Module]] = {
    "mlir-text": _from_mlir_text,
    "mlir-bytecode": _from_bytecode,
    "vhlo-artifact": _from_vhlo,
    "jax-export": _from_jax_export,
    "hlo-text": _from_hlo_text,
    "hlo-proto": _from_hlo_proto,
    "hlo-module-proto": _from_hlo_module_proto,
}


def load_bytes(data: bytes, name: str = STDIN_NAME, context: ir.Context | None = None) -> Loaded:
    """Detects the format of `data` and parses it; `name` is what diagnostics call the input.

    Empty or comment-only text is an empty module, as in mlir-opt (a split chunk may hold only comments)."""
    context = context or make_context()
    try:
        kind = detect_format(data)
    except LoadError as error:
        raise LoadError(f"{name}: error: {error}") from None
    return Loaded(_READERS[kind](data, context, name), kind, name)


def load_file(path: str, context: ir.Context | None = None) -> Loaded:
    """Reads and parses `path` ('-' for stdin)."""
    return load_bytes(read_input(path), display_name(path), context)
