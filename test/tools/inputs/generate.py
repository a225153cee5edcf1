"""Regenerates the small dump samples in this folder, each the way a user would produce it.

Run from the repository root: `python test/tools/inputs/generate.py`. It sets XLA_FLAGS=--xla_dump_to and
JAX_DUMP_IR_TO (before jax starts), compiles one tiny function, exports it with jax.export, and copies
one file of each kind here. Everything lit and pytest read from this folder comes from this script.
"""

import glob
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
DUMP = tempfile.mkdtemp(prefix="hlofuse-dumps-")
os.environ["XLA_FLAGS"] = f"--xla_dump_to={DUMP}/xla --xla_dump_hlo_as_text --xla_dump_hlo_as_proto"
os.environ["JAX_DUMP_IR_TO"] = f"{DUMP}/jax_ir"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax._src.lib import _jax  # noqa: E402


def tanh_matmul(x, y):
    return jax.numpy.tanh(x @ y) + 1.0


def main() -> None:
    x = np.ones((2, 3), np.float32)
    y = np.ones((3, 2), np.float32)
    jax.jit(tanh_matmul)(x, y).block_until_ready()
    exported = jax.export.export(jax.jit(tanh_matmul))(x, y)

    def copy(pattern: str, name: str) -> None:
        (found,) = glob.glob(os.path.join(DUMP, pattern))
        shutil.copyfile(found, os.path.join(HERE, name))

    copy("xla/module_*.jit_tanh_matmul/module.mlir", "xla_dump_module.mlir")
    copy("xla/module_*.jit_tanh_matmul.before_optimizations.txt", "xla_dump.before_optimizations.txt")
    copy("xla/module_*.jit_tanh_matmul.before_optimizations.hlo.pb", "xla_dump.before_optimizations.hlo.pb")
    copy("jax_ir/jax_ir*_jit_tanh_matmul_compile.mlir", "jax_ir_compile.mlir")
    with open(os.path.join(HERE, "tanh_matmul.jax_export"), "wb") as f:
        f.write(exported.serialize())
    with open(os.path.join(HERE, "tanh_matmul.vhlo"), "wb") as f:
        f.write(exported.mlir_module_serialized)
    # A bare HloModuleProto (not wrapped in an HloProto), as hlo_module_from_text serializes it.
    from jaxlib import _hlo

    with open(os.path.join(HERE, "xla_dump.before_optimizations.txt")) as f:
        proto = _hlo.hlo_module_from_text(f.read()).as_serialized_hlo_module_proto()
    with open(os.path.join(HERE, "hlo_module_proto.pb"), "wb") as f:
        f.write(proto)
    # MLIR bytecode of the StableHLO module, as `hlofuse-opt --emit-bytecode` or jaxlib writes it.
    with open(os.path.join(HERE, "tanh_matmul.mlirbc"), "wb") as f:
        f.write(_jax.mlir.hlo_to_stablehlo(proto))
    shutil.rmtree(DUMP)
    triton_tiles_too_large()
    print(f"wrote samples to {HERE}", file=sys.stderr)


def triton_tiles_too_large() -> None:
    """A module whose Triton kernel was lowered with tiles the H100 cannot hold (f32, H = 256, 64 x 64 tiles:
    256 KiB of shared memory), as an explicit BlockSizes gives it: --compile-for's error path."""
    import jax.numpy as jnp

    from hlofuse.kernels.pallas.attention import BlockSizes, attention

    def attend(q, k, v):
        return attention(q, k, v, scale=256**-0.5, causal=True, backend="gpu", block_sizes=BlockSizes(64, 64))

    x = jax.ShapeDtypeStruct((1, 128, 2, 256), jnp.float32)
    module = jax.jit(attend).trace(x, x, x).lower(lowering_platforms=("cuda",)).compiler_ir("stablehlo")
    with open(os.path.join(HERE, "triton_f32_h256_64x64.mlir"), "w") as f:
        f.write(module.operation.get_asm(enable_debug_info=False))


if __name__ == "__main__":
    main()
