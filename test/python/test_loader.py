"""hlofuse.ir.loader: format detection from content, every dump form, and one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from hlofuse.ir import loader
from hlofuse.ir.context import make_context

INPUTS = Path(__file__).resolve().parents[1] / "tools" / "inputs"

SAMPLES = {
    "xla_dump_module.mlir": "mlir-text",
    "jax_ir_compile.mlir": "mlir-text",
    "tanh_matmul.mlirbc": "mlir-bytecode",
    "tanh_matmul.vhlo": "vhlo-artifact",
    "tanh_matmul.jax_export": "jax-export",
    "xla_dump.before_optimizations.txt": "hlo-text",
    "xla_dump.before_optimizations.hlo.pb": "hlo-proto",
    "hlo_module_proto.pb": "hlo-module-proto",
}

TEXT = """func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.add %a, %a : tensor<4xf32>
  return %0 : tensor<4xf32>
}
"""


@pytest.fixture(scope="module")
def context():
    return make_context()


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_every_sample_is_detected_and_loads(name, context):
    loaded = loader.load_file(str(INPUTS / name), context)
    assert loaded.format == SAMPLES[name]
    text = str(loaded.module)
    assert "@main" in text
    assert "stablehlo.tanh" in text


def test_detection_uses_content_not_the_file_name(tmp_path, context):
    disguised = tmp_path / "model.mlir"
    disguised.write_bytes((INPUTS / "tanh_matmul.jax_export").read_bytes())
    assert loader.load_file(str(disguised), context).format == "jax-export"


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        (b"module {\n}\n", "mlir-text"),
        (b"// a comment\nHloModule m\n", "hlo-text"),
        (b"  \nHloModule jit_f, entry_computation_layout={()->f32[]}\n", "hlo-text"),
        (b"ML\xefR\x0dMLIR23.0.0git\x00rest", "mlir-bytecode"),
        (b"ML\xefR\x0dStableHLO_v1.13.0\x00rest", "vhlo-artifact"),
        (b"\x0a\x05jit_f\x12\x02xx", "hlo-module-proto"),
        (b"\x0a\x07\x0a\x05jit_f", "hlo-proto"),
    ],
)
def test_detect_format(data, kind):
    assert loader.detect_format(data) == kind


def test_hlo_proto_wraps_the_bare_module_proto():
    wrapped = (INPUTS / "xla_dump.before_optimizations.hlo.pb").read_bytes()
    assert loader.detect_format(wrapped) == "hlo-proto"
    payload = loader._first_proto_field(wrapped)
    assert payload is not None and loader.detect_format(payload) == "hlo-module-proto"


def test_unrecognised_binary_is_one_line(context):
    with pytest.raises(loader.LoadError) as caught:
        loader.load_bytes(b"\xff\xfe\x00\x01garbage", "blob.bin", context)
    assert str(caught.value).startswith("blob.bin: error: unrecognised input")
    assert "\n" not in str(caught.value)


def test_empty_input_is_an_empty_module(context):
    loaded = loader.load_bytes(b"  \n// only a comment\n", "in.mlir", context)
    assert loaded.format == "mlir-text"
    assert str(loaded.module).strip() == "module {\n}"


def test_parse_error_has_file_line_col(context):
    bad = TEXT.replace("stablehlo.add", "stablehlo.bogus")
    with pytest.raises(loader.LoadError) as caught:
        loader.load_bytes(bad.encode(), "case.mlir", context)
    assert str(caught.value) == "case.mlir:2:8: error: custom op 'stablehlo.bogus' is unknown"


def test_bad_hlo_text_is_one_line(context):
    with pytest.raises(loader.LoadError) as caught:
        loader.load_bytes(b"HloModule broken\n\nENTRY %main {\n  nonsense\n}\n", "x.txt", context)
    message = str(caught.value)
    assert message.startswith("x.txt: error: cannot parse HLO text:")
    assert "\n" not in message


def test_missing_file_and_directory():
    with pytest.raises(loader.LoadError, match="nope.mlir: error: cannot read input: No such file"):
        loader.read_input("/nonexistent/nope.mlir")
    with pytest.raises(loader.LoadError, match="error: is a directory"):
        loader.read_input(str(INPUTS))


def test_text_locations_name_the_input(context):
    module = loader.load_bytes(TEXT.encode(), "model.mlir", context).module
    asm = module.operation.get_asm(enable_debug_info=True)
    assert 'loc("model.mlir":2:8)' in asm
    assert '"-":' not in asm


def test_dump_locations_are_kept(context):
    module = loader.load_file(str(INPUTS / "xla_dump_module.mlir"), context).module
    asm = module.operation.get_asm(enable_debug_info=True)
    assert "generate.py" in asm


def test_jax_export_without_flatbuffers(monkeypatch, context):
    import jax.export

    def no_flatbuffers(_data):
        raise ImportError("Please install 'flatbuffers'")

    monkeypatch.setattr(jax.export, "deserialize", no_flatbuffers)
    loaded = loader.load_file(str(INPUTS / "tanh_matmul.jax_export"), context)
    assert loaded.format == "jax-export"
    assert "stablehlo.tanh" in str(loaded.module)
